"""Request translation of every API family (OpenAI, Anthropic Messages, Responses): explicit nulls, ignored and
refused parameters, each dialect's error bodies and context-overflow wording. The real app runs with its replicas
never started, so a request that passes every check ends at "no replica is ready" (503)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from fastapi.testclient import TestClient

from llamafleet.api.anthropic import MessageRenderer, matched_stop
from llamafleet.api.anthropic_requests import MessagesRequest
from llamafleet.api.app import create_app
from llamafleet.api.openai import context_error
from llamafleet.api.openai_requests import ChatCompletionRequest, CompletionRequest
from llamafleet.api.responses import ResponseRenderer
from llamafleet.api.responses_requests import ResponsesRequest
from llamafleet.engine.types import ContextOverflow
from one_model import one_model_service

MODEL = "tiny-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
MESSAGE = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
KEY = "sk-test-key"


def _client(api_keys: frozenset[str] = frozenset()) -> TestClient:
    service = one_model_service(MODEL, api_keys=api_keys)
    return TestClient(create_app(service, on_ready=lambda: None, on_fatal=lambda _m: None))


@pytest.fixture(scope="module")
def client() -> TestClient:
    return _client()


def _openai_error(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    return dict(resp.json()["error"])


def _anthropic_error(resp: Any, status: int, kind: str) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return str(body["error"]["message"])


NULLS = {"temperature": None, "top_p": None, "n": None, "max_tokens": None, "stop": None, "seed": None,
         "stream": None, "stream_options": None, "presence_penalty": None, "frequency_penalty": None,
         "logit_bias": None, "user": None, "tools": None, "tool_choice": None, "parallel_tool_calls": None,
         "response_format": None, "logprobs": None, "top_logprobs": None, "max_completion_tokens": None,
         "metadata": None, "store": None, "service_tier": None, "prediction": None, "functions": None}


def test_explicit_nulls_mean_not_set() -> None:
    req = ChatCompletionRequest.model_validate({**CHAT, **NULLS})
    assert req == ChatCompletionRequest.model_validate(CHAT)
    assert req.sampling(None, 0, False) == ChatCompletionRequest.model_validate(CHAT).sampling(None, 0, False)
    text = CompletionRequest.model_validate({"model": MODEL, "prompt": "x", "max_tokens": None, "echo": None,
                                             "logprobs": None, "suffix": None, "best_of": None, "stop": None})
    assert text.max_tokens == 16  # OpenAI's default for text completions, null or absent


@pytest.mark.parametrize("extra", [
    NULLS,
    {"logit_bias": {}, "tools": [], "tool_choice": "none", "parallel_tool_calls": True, "user": "u-1",
     "metadata": {"team": "a"}, "store": True, "service_tier": "auto", "prediction": {"type": "content"},
     "reasoning_effort": "low", "response_format": {"type": "text"}, "top_logprobs": 0, "modalities": ["text"],
     "stream_options": {"include_usage": True, "include_obfuscation": False}, "stream": True},
])
def test_accepted_chat_parameters_reach_the_replicas(client: TestClient, extra: dict[str, Any]) -> None:
    err = _openai_error(client.post("/v1/chat/completions", json={**CHAT, **extra}), 503)
    assert err["code"] == "service_unavailable"  # validated, checked, and only then refused: no replica is up


@pytest.mark.parametrize("extra", [
    {"prompt": "x", "echo": True, "logprobs": 1, "max_tokens": 0},
    {"prompt": [1, 2, 3], "logprobs": 20},
    {"prompt": [[1, 2], [3]], "echo": True},
])
def test_evaluation_parameters_reach_the_replicas(client: TestClient, extra: dict[str, Any]) -> None:
    err = _openai_error(client.post("/v1/completions", json={"model": MODEL, **extra}), 503)
    assert err["code"] == "service_unavailable"  # accepted: only the missing replicas refuse it


@pytest.mark.parametrize(("change", "param", "words"), [
    ({"suffix": "end"}, "suffix", "fill in the middle"),
    ({"best_of": 3}, "best_of", "best_of equal to n"),
])
def test_completion_features_not_built_yet_are_named(client: TestClient, change: dict[str, Any], param: str,
                                                     words: str) -> None:
    err = _openai_error(client.post("/v1/completions", json={"model": MODEL, "prompt": "x", **change}), 400)
    assert err["param"] == param and err["code"] == "unsupported_parameter"
    assert f"'{param}' is not supported yet" in err["message"] and words in err["message"]


def test_openai_context_overflow_words() -> None:
    chat = context_error(ContextOverflow(512, 500, 100), "messages")
    assert chat.message == ("This model's maximum context length is 512 tokens. However, you requested 600 tokens "
                            "(500 in the messages, 100 in the completion). Please reduce the length of the messages "
                            "or completion.")
    assert (chat.status, chat.code, chat.param) == (400, "context_length_exceeded", "messages")
    no_room = context_error(ContextOverflow(512, 600, None), "messages")
    assert no_room.message.startswith("This model's maximum context length is 512 tokens. However, your messages "
                                      "resulted in 600 tokens")
    text = context_error(ContextOverflow(512, 500, 16), "prompt")
    assert text.message.startswith("This model's maximum context length is 512 tokens, however you requested 516 "
                                   "tokens (500 in your prompt; 16 for the completion)")
    assert text.param == "prompt"


def test_context_overflow_check_and_pickling() -> None:
    ContextOverflow.check(512, 511, None)  # one token of room: fits
    ContextOverflow.check(512, 500, 12)
    with pytest.raises(ContextOverflow, match="leaves no room"):
        ContextOverflow.check(512, 512, None)
    with pytest.raises(ContextOverflow) as caught:
        ContextOverflow.check(512, 500, 13)
    again = pickle.loads(pickle.dumps(caught.value))  # it crosses the worker's pipe inside Rejected
    assert (again.n_ctx, again.prompt_tokens, again.max_tokens) == (512, 500, 13)
    assert str(again) == str(caught.value) and isinstance(again, ValueError)


def test_anthropic_request_becomes_chat_turns() -> None:
    req = MessagesRequest.model_validate({
        **MESSAGE, "system": [{"type": "text", "text": "Be ", "cache_control": {"type": "ephemeral"}},
                              {"type": "text", "text": "brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                     {"role": "assistant", "content": [{"type": "thinking", "thinking": "...", "signature": "s"},
                                                       {"type": "text", "text": "Hello"}]},
                     {"role": "user", "content": "Bye"}],
        "metadata": {"user_id": "u"}, "stop_sequences": ["\n\n"], "temperature": 0, "top_k": 5,
        "thinking": None, "tools": [], "tool_choice": {"type": "auto"}})
    assert req.turns() == (("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello"), ("user", "Bye"))
    params = req.sampling()
    assert params.stop == ("\n\n",) and params.greedy and params.top_k == 5 and params.max_tokens == 8
    assert params.logprobs  # to tell which stop sequence matched
    assert not MessagesRequest.model_validate(MESSAGE).sampling().logprobs


def test_which_stop_sequence_matched() -> None:
    pieces = [b"Hel", b"lo", b" EN", b"D!"]
    assert matched_stop("Hello", pieces, ["END", " EN", "zzz"]) == " EN"
    assert matched_stop("Hello", [b"Hel", b"lo", b""], ["END"]) is None  # end of generation: no stop sequence
    assert matched_stop("caf\u00e9", [b"caf\xc3", b"\xa9\n\n"], ["\n", "\n\n"]) == "\n"  # the first to complete


@pytest.mark.parametrize(("block", "param", "kind", "words"), [
    ({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
     "messages[0].content[1]", "invalid_request_error", "image content is not supported"),
    ({"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}}, "messages[0].content[1]",
     "invalid_request_error", "server_tool_use content is not supported"),
])
def test_anthropic_blocks_that_are_not_text_are_refused(client: TestClient, block: dict[str, Any], param: str,
                                                        kind: str, words: str) -> None:
    content = [{"type": "text", "text": "Look:"}, block]
    resp = client.post("/v1/messages", json={**MESSAGE, "messages": [{"role": "user", "content": content}]})
    message = _anthropic_error(resp, 400, kind)
    assert param in message and words in message


def test_anthropic_errors_use_anthropic_bodies(client: TestClient) -> None:
    assert "max_tokens" in _anthropic_error(client.post("/v1/messages", json={**MESSAGE, "max_tokens": None}),
                                            400, "invalid_request_error")
    assert "tools" in _anthropic_error(client.post("/v1/messages", json={**MESSAGE, "tools": [{"name": "f"}]}),
                                       400, "invalid_request_error")
    assert "gpt-4" in _anthropic_error(client.post("/v1/messages", json={**MESSAGE, "model": "gpt-4"}),
                                       404, "not_found_error")
    _anthropic_error(client.post("/v1/messages", json=MESSAGE), 503, "overloaded_error")  # no replica is up
    _anthropic_error(client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": MESSAGE["messages"]}),
                     503, "overloaded_error")
    assert _openai_error(client.post("/v1/chat/completions", json={**CHAT, "n": 0}), 400)["param"] == "n"


def test_anthropic_overflow_words() -> None:
    render = MessageRenderer("msg_1", MODEL, ())
    both = render.overflow(ContextOverflow(512, 500, 100))
    assert both.message == ("input length and `max_tokens` exceed context limit: 500 + 100 > 512, decrease input "
                            "length or `max_tokens` and try again")
    assert render.overflow(ContextOverflow(512, 900, 100)).message == "prompt is too long: 900 tokens > 511 maximum"


def test_keys_are_taken_from_x_api_key_too() -> None:
    client = _client(frozenset({KEY}))
    _anthropic_error(client.post("/v1/messages", json=MESSAGE, headers={"x-api-key": KEY}), 503, "overloaded_error")
    assert "x-api-key" in _anthropic_error(client.post("/v1/messages", json=MESSAGE), 401, "authentication_error")
    _anthropic_error(client.post("/v1/messages", json=MESSAGE, headers={"x-api-key": "wrong"}), 401,
                     "authentication_error")
    assert _openai_error(client.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": KEY}), 503)
    assert _openai_error(client.post("/v1/chat/completions", json=CHAT), 401)["code"] == "invalid_api_key"


def test_responses_request_becomes_chat_turns() -> None:
    req = ResponsesRequest.model_validate({
        "model": MODEL, "instructions": "Be brief.", "store": False, "max_output_tokens": 9, "temperature": None,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                  {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                   "content": [{"type": "output_text", "text": "Hello", "annotations": []}]},
                  {"role": "developer", "content": "Answer in French."}]})
    assert req.turns() == (("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello"),
                           ("system", "Answer in French."))
    assert req.sampling().max_tokens == 9 and req.sampling().temperature == 1.0
    assert ResponsesRequest.model_validate({"model": MODEL, "input": "Hi"}).turns() == (("user", "Hi"),)


@pytest.mark.parametrize(("change", "param", "words"), [
    ({"conversation": "conv_1"}, "conversation", "continue a stored response with 'previous_response_id'"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "item references are not supported"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]", "web_search tools are not supported"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"patternProperties": {}}}}},
     "text.format.schema", "'patternProperties' (at patternProperties) cannot be enforced"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]", "input_image content is not supported"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "reasoning items are not supported"),
])
def test_responses_refusals_name_the_parameter(client: TestClient, change: dict[str, Any], param: str,
                                               words: str) -> None:
    err = _openai_error(client.post("/v1/responses", json={"model": MODEL, "input": "Hi", **change}), 400)
    assert err["param"] == param and words in err["message"]


def test_responses_overflow_words() -> None:
    req = ResponsesRequest.model_validate({"model": MODEL, "input": "Hi"})
    err = ResponseRenderer(req, "resp_1", MODEL, 0).overflow(ContextOverflow(512, 600, None))
    assert err.code == "context_length_exceeded" and err.param == "input"
    assert err.message.startswith("Your input exceeds the context window of this model (512 tokens)")


def test_top_logprobs_without_logprobs_is_refused_as_openai_does(client: TestClient) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}
    err = _openai_error(client.post("/v1/chat/completions", json=body), 400)
    assert err["param"] == "top_logprobs" and "'logprobs': true" in err["message"]
