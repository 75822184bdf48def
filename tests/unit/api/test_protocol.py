"""HTTP request validation and OpenAI error bodies, on the real app with its replicas not started.

Nothing is loaded here: validation, model names and "no replica is up" are all decided before any work reaches a
worker, so the app answers these requests on its own.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from llamafleet.api.app import create_app
from llamafleet.api.openai_requests import ChatCompletionRequest, CompletionRequest
from llamafleet.api.protocol import GenerateRequest
from one_model import one_model_service

MODEL = "tiny-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def client() -> TestClient:
    service = one_model_service(MODEL)
    return TestClient(create_app(service, on_ready=lambda: None, on_fatal=lambda _m: None))


def _error(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


def test_bad_json(client: TestClient) -> None:
    resp = client.post("/v1/chat/completions", content=b'{"model": "x", ', headers={"content-type": "application/json"})
    err = _error(resp, 400)
    assert "not valid JSON" in err["message"] and err["type"] == "invalid_request_error"


def test_body_that_is_not_an_object(client: TestClient) -> None:
    err = _error(client.post("/v1/completions", json=[1, 2]), 400)
    assert "JSON object" in err["message"]


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"temperature": "hot"}, "temperature", "valid number"),
        ({"temperature": 3}, "temperature", "less than or equal to 2"),
        ({"n": 0}, "n", "greater than or equal to 1"),
        ({"n": True}, "n", "valid integer"),
        ({"max_tokens": -5}, "max_tokens", "greater than or equal to 1"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"seed": 2**40}, "seed", "less than 4294967296"),
        ({"stop": 7}, "stop", "valid string, or Input should be a valid list"),
        ({"stop": ["ok", ""]}, "stop", "must not be empty"),
        ({"messages": []}, "messages", "at least 1 item"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "'user'"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "valid string"),
        ({"logit_bias": {"the": 2}}, "logit_bias", "keys are token ids"),
        ({"logit_bias": {"1": 200}}, "logit_bias", "between -100 and 100"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 3}}}}}], "tool_choice": "required"}, "tools",
         "'minimum' (at anyOf[0].properties.arguments.properties.n.minimum) cannot be enforced"),
        ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function",
          "function": {"name": "g"}}}, "tool_choice", "no function named 'g'"),
        ({"functions": [{"name": "f"}]}, "functions", "send the functions as 'tools'"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
            "type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}}}},
         "response_format.json_schema.schema", "'minimum' (at properties.age.minimum) cannot be enforced"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
            "$ref": "https://example.com/person.json"}}}}, "response_format.json_schema.schema",
         "only references inside the schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}},
         "response_format.json_schema.schema", "missing required parameter"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "'json_schema'"),
        ({"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "grammar", "not both"),
        ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos", "ends the answer"),
        ({"grammar": "root ::= " + "(" * 3000 + '"a"' + ")" * 3000}, "grammar", "nests groups 3000 deep"),
        ({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "c"}]}]},
         "messages[0].tool_calls[0].type", "missing required parameter"),
        ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0]", "needs the 'tool_call_id'"),
        ({"messages": [{"role": "assistant", "content": None}]}, "messages[0]", "'content' is required"),
        ({"frobnicate": 1}, "frobnicate", "unknown or unsupported parameter"),
    ],
)
def test_chat_parameters_are_checked(client: TestClient, change: dict[str, Any], param: str, words: str) -> None:
    err = _error(client.post("/v1/chat/completions", json={**CHAT, **change}), 400)
    assert err["param"] == param
    assert words in err["message"]
    assert param in err["message"]


def test_missing_fields(client: TestClient) -> None:
    err = _error(client.post("/v1/chat/completions", json={"model": MODEL}), 400)
    assert err["message"] == "missing required parameter 'messages'" and err["param"] == "messages"
    err = _error(client.post("/v1/completions", json={"model": MODEL}), 400)
    assert err["param"] == "prompt"
    err = _error(client.post("/api/generate", json={"max_tokens": 3}), 400)
    assert err["param"] == "prompt"


def test_prompt_batch_limits(client: TestClient) -> None:
    err = _error(client.post("/v1/completions", json={"model": MODEL, "prompt": []}), 400)
    assert "1 to 64 entries" in err["message"]
    err = _error(client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "logprobs": 21}), 400)
    assert err["param"] == "logprobs"
    err = _error(client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 0}), 400)
    assert err["param"] == "max_tokens" and "echo and logprobs" in err["message"]


def test_unknown_model_is_404_naming_the_served_one(client: TestClient) -> None:
    err = _error(client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4"}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert "'gpt-4'" in err["message"] and MODEL in err["message"]
    _error(client.get("/v1/models/gpt-4"), 404)


def test_no_replica_up_is_503(client: TestClient) -> None:
    err = _error(client.post("/v1/chat/completions", json=CHAT), 503)
    assert err["type"] == "server_error" and err["code"] == "service_unavailable"
    assert "no replica is ready" in err["message"]
    _error(client.post("/api/generate", json={"prompt": "hi"}), 503)


def test_models_health_and_ready(client: TestClient) -> None:
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    assert client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    assert client.get("/health").json() == {"status": "ok"}
    ready = client.get("/ready")
    assert ready.status_code == 503 and ready.json()["status"] == "loading"
    assert ready.json()["replicas"][0]["status"] == "idle"


def test_unknown_routes_and_methods_use_the_error_body(client: TestClient) -> None:
    assert "no route GET /v2/nothing" in _error(client.get("/v2/nothing"), 404)["message"]
    _error(client.get("/v1/chat/completions"), 405)


def test_sampling_params_per_choice() -> None:
    req = ChatCompletionRequest.model_validate({**CHAT, "seed": 2**32 - 1, "stop": "\n", "temperature": 0,
                                                "presence_penalty": 0.5, "top_k": 5})
    first, second = req.sampling(16, 0, False), req.sampling(16, 1, True)
    assert (first.seed, second.seed) == (2**32 - 1, 0)  # each choice its own seed, wrapping
    assert first.stop == ("\n",) and first.greedy and first.presence_penalty == 0.5 and first.top_k == 5
    assert second.logprobs and not first.logprobs and first.max_tokens == 16


def test_token_limits_and_defaults() -> None:
    chat = ChatCompletionRequest.model_validate({**CHAT, "max_tokens": 9, "max_completion_tokens": 7})
    assert chat.token_limit() == 7
    assert ChatCompletionRequest.model_validate(CHAT).token_limit() is None
    text = CompletionRequest.model_validate({"model": MODEL, "prompt": ["a", "b"]})
    assert text.max_tokens == 16 and text.prompts() == ["a", "b"]
    parts = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "developer", "content": [{"type": "text", "text": "be "},
                                                                        {"type": "text", "text": "brief"}]}]})
    assert parts.messages[0].turn() == ("system", "be brief")


def test_generate_request() -> None:
    assert GenerateRequest.model_validate({"prompt": "x"}).max_tokens == 128
    with pytest.raises(ValidationError, match="stop strings must not be empty"):
        GenerateRequest.model_validate({"prompt": "x", "stop": [""]})


def test_text_deltas_carry_no_tool_calls_key() -> None:
    """Clients that test for the key (not its value) would read every text delta as a tool call."""
    from llamafleet.api.protocol import ChatDelta

    assert "tool_calls" not in json.loads(ChatDelta(content="x").model_dump_json())
    assert "tool_calls" not in ChatDelta(content="x").model_dump()
