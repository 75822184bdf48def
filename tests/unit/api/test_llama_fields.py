"""llama-server's own request fields on the OpenAI routes (api/llama_fields.py), one test per kind: honoured (each
reaches the engine's parameters), accepted without effect (the same parameters as without them), refused unless at
their neutral values (a 400 naming the field). The real app runs with its replicas never started, so a request that
passes every check ends at "no replica is ready" (503)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from llamafleet.api.app import create_app
from llamafleet.api.openai_requests import ChatCompletionRequest, CompletionRequest
from llamafleet.engine.types import SamplingParams
from one_model import one_model_service

MODEL = "tiny-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
NO_OPS = {"cache_prompt": True, "id_slot": 1, "samplers": ["top_k", "temperature"], "t_max_predict_ms": 500,
          "t_max_prompt_ms": 100, "n_keep": 4, "n_discard": 2, "n_indent": 2, "min_keep": 1, "n_cache_reuse": 256,
          "backend_sampling": False, "timings_per_token": True, "return_tokens": True, "return_progress": True,
          "post_sampling_probs": True, "verbose": True, "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
          "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "xtc_probability": 0.0, "xtc_threshold": 0.1,
          "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
          "dry_sequence_breakers": ["\n"], "top_n_sigma": -1.0, "lora": []}


def chat(**body: Any) -> SamplingParams:
    req = ChatCompletionRequest.model_validate({**CHAT, **body})
    return req.sampling(req.token_limit(), 0, req.logprobs)


def completion(**body: Any) -> SamplingParams:
    req = CompletionRequest.model_validate({"model": MODEL, "prompt": "hi", **body})
    return req.sampling(req.max_tokens, 0, req.logprobs is not None)


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(one_model_service(MODEL), on_ready=lambda: None, on_fatal=lambda _m: None))


def test_honoured_fields_reach_the_engine() -> None:
    for to_params in (chat, completion):
        assert to_params(n_predict=12).max_tokens == 12
        assert to_params(n_predict=-1).max_tokens is None  # until the context ends (completions' default is 16)
        assert to_params(n_predict=12, max_tokens=12).max_tokens == 12
        assert to_params(repeat_last_n=-1).penalty_last_n == -1
        probs = to_params(n_probs=3)
        assert probs.logprobs and probs.top_logprobs == 3
    assert chat(n_probs=3, logprobs=True, top_logprobs=1).top_logprobs == 1  # OpenAI's fields win when sent
    assert completion(n_probs=3, logprobs=1).top_logprobs == 1
    assert chat(n_predict=5, max_completion_tokens=5).max_tokens == 5


def test_no_op_fields_are_accepted_and_change_nothing(client: TestClient) -> None:
    assert chat(**NO_OPS) == chat() and completion(**NO_OPS) == completion()
    for route, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"model": MODEL, "prompt": "hi"})):
        r = client.post(route, json={**body, **NO_OPS, "cache_prompt": False})
        assert r.status_code == 503, r.text  # validated, checked, and only then refused: no replica is up


@pytest.mark.parametrize(("field", "value"), [("mirostat", 2), ("dynatemp_range", 0.5), ("xtc_probability", 0.5),
                                              ("dry_multiplier", 0.8), ("top_n_sigma", 1.0)])
def test_samplers_this_server_lacks_are_refused_unless_off(client: TestClient, field: str, value: Any) -> None:
    for route, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"model": MODEL, "prompt": "hi"})):
        r = client.post(route, json={**body, field: value})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == field and "no such sampler" in err["message"]


def test_an_adapter_the_model_lacks_is_refused_by_id(client: TestClient) -> None:
    for route, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"model": MODEL, "prompt": "hi"})):
        r = client.post(route, json={**body, "lora": [{"id": 0, "scale": 0.5}]})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "lora" and "lora[0].id: no adapter 0; this model's adapters are none" in err["message"]
        assert client.post(route, json={**body, "lora": []}).status_code == 503  # none asked: only no replica up


def test_n_cmpl_is_n_and_json_schema_is_a_response_format() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    for model, body in ((ChatCompletionRequest, CHAT), (CompletionRequest, {"model": MODEL, "prompt": "hi"})):
        assert model.model_validate({**body, "n_cmpl": 3}).n == 3
        assert model.model_validate({**body, "n_cmpl": 2, "n": 2}).n == 2
        assert model.model_validate({**body, "json_schema": schema}).constraint is not None
    assert ChatCompletionRequest.model_validate({**CHAT, "json_schema": schema}).constraint == \
        ChatCompletionRequest.model_validate({**CHAT, "response_format": fmt}).constraint


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"n_cmpl": 2, "n": 3}, "n_cmpl", "n_cmpl (2) and n (3) disagree"),
    ({"n_cmpl": 0}, "n_cmpl", "greater than or equal to 1"),
    ({"n_cmpl": 17}, "n_cmpl", "less than or equal to 16"),
    ({"json_schema": {"type": "object"}, "response_format": {"type": "json_object"}}, "json_schema",
     "send 'response_format' or 'json_schema', not both"),
    ({"json_schema": {"type": "object"}, "grammar": "root ::= \"a\""}, "grammar", "send 'json_schema' or 'grammar'"),
    ({"json_schema": {"type": "nonsense"}}, "json_schema", "invalid 'json_schema'"),
])
def test_n_cmpl_and_json_schema_refusals_name_the_field(client: TestClient, body: dict[str, Any], param: str,
                                                        words: str) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"n_predict": 0}, "n_predict", "-1 (until the context ends) or at least 1"),
    ({"n_predict": 8, "max_tokens": 9}, "n_predict", "disagree"),
    ({"n_predict": -2}, "n_predict", "greater than or equal to -1"),
    ({"n_probs": 99}, "n_probs", "less than or equal to"),
    ({"cache_prompt": "yes"}, "cache_prompt", "boolean"),
])
def test_bad_values_are_400s(client: TestClient, body: dict[str, Any], param: str, words: str) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, **body})
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"] and r.json()["error"]["param"] == param
