"""Anthropic tools translated to the OpenAI tools machinery: the same system-prompt section, history and forced-call
grammar as the equivalent OpenAI chat request; the answer's calls as ``tool_use`` blocks, whole and streamed; and the
refusals, each naming its parameter. The app runs with its replicas never started (a request that passes every check
ends at 503)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from llamafleet.api.anthropic import MessageRenderer
from llamafleet.api.anthropic_requests import MessagesRequest
from llamafleet.api.app import create_app
from llamafleet.api.openai_requests import ChatCompletionRequest
from llamafleet.api.tool_calls import CallStreams
from llamafleet.engine.types import RequestOutput
from llamafleet.fleet.dispatch import Delta
from one_model import one_model_service

MODEL = "tiny-model"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "The weather in a city.", "input_schema": SCHEMA}
TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                       "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                  "content": [{"type": "text", "text": "sunny"}]},
                                 {"type": "text", "text": "Thanks"}]},
]
OPENAI_HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "toolu_1", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
    {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
    {"role": "user", "content": "Thanks"},
]


def _message(**kw: Any) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": MODEL, "max_tokens": 50, "system": "Be brief.",
                                           "messages": HISTORY, **kw})


def _chat(**kw: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": MODEL, "messages": OPENAI_HISTORY, **kw})


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool["name"], "description": tool.get("description"),
                                             "parameters": tool["input_schema"]}}


@pytest.mark.parametrize(("anthropic_choice", "openai_choice"), [
    ({"type": "auto"}, "auto"),
    ({"type": "any"}, "required"),
    ({"type": "any", "disable_parallel_tool_use": True}, "required"),
    ({"type": "tool", "name": "get_time"}, {"type": "function", "function": {"name": "get_time"}}),
    ({"type": "none"}, "none"),
])
def test_same_prompt_and_grammar_as_openai(anthropic_choice: dict[str, Any], openai_choice: Any) -> None:
    msg = _message(tools=[WEATHER, TIME], tool_choice=anthropic_choice)
    chat = _chat(tools=[_function(WEATHER), _function(TIME)], tool_choice=openai_choice,
                 parallel_tool_calls=not anthropic_choice.get("disable_parallel_tool_use"))
    assert msg.turns() == chat.turns()
    assert msg.sampling().grammar == chat.constraint
    assert msg.forced == chat.forced
    if anthropic_choice["type"] == "none":
        assert "<tools>" not in msg.turns()[0][1] and msg.sampling().grammar is None
    else:
        assert "<tools>" in msg.turns()[0][1]
    assert ("assistant", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                         "</tool_call>") in msg.turns()


def test_error_results_and_text_only_results() -> None:
    msg = MessagesRequest.model_validate({"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": True},
                                     {"type": "tool_result", "tool_use_id": "u"}]}]})
    assert msg.turns() == (("user", "<tool_response>\nError: boom\n</tool_response>"),
                           ("user", "<tool_response>\n\n</tool_response>"))


def _delta(text: str, finished: bool = False) -> Delta:
    return Delta(RequestOutput("m", text=text, token_ids=[1], finished=finished,
                               finish_reason="stop" if finished else None, prompt_tokens=7, completion_tokens=3), None)


def test_calls_become_tool_use_blocks_whole_and_streamed() -> None:
    answer = ['Sure.<tool', '_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>']
    stream = MessageRenderer("msg_1", MODEL, (), CallStreams({"get_weather"}, forced=False))
    events = [e.model_dump() for i, t in enumerate(answer) for e in stream.chunk(0, _delta(t, i == 1))]
    kinds = [e["type"] for e in events]
    assert kinds == ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
                     "message_stop"]
    assert events[3]["delta"] == {"type": "text_delta", "text": "Sure."}
    start, part = events[5], events[6]
    assert start["index"] == 1 and start["content_block"]["input"] == {}
    assert start["content_block"]["id"].startswith("toolu_") and start["content_block"]["name"] == "get_weather"
    assert part["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Oslo"}'}
    assert events[8]["delta"]["stop_reason"] == "tool_use"


def test_a_forced_answer_of_calls_alone_has_no_text_block() -> None:
    stream = MessageRenderer("msg_1", MODEL, (), CallStreams({"get_time"}, forced=True))
    events = [e.model_dump() for e in stream.chunk(0, _delta('<tool_call>\n{"name": "get_time", "arguments": {}}\n'
                                                              "</tool_call>", True))]
    blocks = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert blocks == ["tool_use"] and events[1]["index"] == 0


@pytest.fixture(scope="module")
def client() -> TestClient:
    service = one_model_service(MODEL)
    return TestClient(create_app(service, on_ready=lambda: None, on_fatal=lambda _m: None))


@pytest.mark.parametrize(("change", "words"), [
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "tool", "name": "nope"}}, "no function named 'nope'"),
    ({"tool_choice": {"type": "any"}, "tools": []}, "needs 'tools'"),
    ({"tools": [{"name": "bad name", "input_schema": SCHEMA}]}, "tools[0].name"),
    ({"tools": [WEATHER, WEATHER]}, "names must be unique"),
    ({"tools": [{"name": "f"}]}, "input_schema"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
     "tool_use blocks belong in assistant messages"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": [{"type": "image", "source": {}}]}]}]},
     "messages[0].content[0].content[0]': image content is not supported"),
])
def test_refusals_name_the_parameter(client: TestClient, change: dict[str, Any], words: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], **change}
    for route, extra in (("/v1/messages", {"max_tokens": 8}), ("/v1/messages/count_tokens", {})):
        resp = client.post(route, json={**body, **extra})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and words in error["message"], error


def test_a_valid_tool_request_reaches_the_replicas(client: TestClient) -> None:
    body = {"model": MODEL, "max_tokens": 8, "messages": HISTORY, "tools": [WEATHER],
            "tool_choice": {"type": "tool", "name": "get_weather"}}
    assert client.post("/v1/messages", json=body).status_code == 503  # every check passed; no replica is up
