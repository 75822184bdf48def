"""Tool calling through a real ``llamafleet serve`` with the OpenAI SDK: forced calls (``tool_choice`` "required" and
a named function) are well-formed and their arguments follow the function's schema at any temperature; a full
round-trip (call -> ``role: "tool"`` result -> answer); streamed calls, assembled by the SDK's stream helper, equal
the whole ones at temperature 0; and requests the API must refuse."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai import OpenAI

from conftest import FleetServer

pytestmark = pytest.mark.each_engine
FORCED = "the call is forced with a grammar (tool_choice any, required or named), which the torch engine refuses"

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "maxLength": 24},
                                      "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False},
    },
}
TIME: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time now in a time zone.",
                 "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}},
                                "required": ["zone"]}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def valid_call(call: Any) -> dict[str, Any]:
    """The arguments of an SDK tool call, checked against its function's schema."""
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "unit"}, args
        assert isinstance(args["city"], str) and len(args["city"]) <= 24
        assert args["unit"] in ("celsius", "fahrenheit")
    else:
        assert call.function.name == "get_time", call.function.name
        assert set(args) == {"zone"} and isinstance(args["zone"], str), args
    return dict(args)


@pytest.mark.llama_cpp_only(reason=FORCED)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_gives_well_formed_calls(client: OpenAI, fleet: FleetServer, temperature: float) -> None:
    out = client.chat.completions.create(model=fleet.model(), messages=ASK, tools=[WEATHER, TIME],  # type: ignore
                                         tool_choice="required", temperature=temperature, seed=3, max_tokens=200)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        valid_call(call)


@pytest.mark.llama_cpp_only(reason=FORCED)
def test_named_function_is_the_one_called(client: OpenAI, fleet: FleetServer) -> None:
    out = client.chat.completions.create(
        model=fleet.model(), messages=ASK, tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=1.0, seed=11, n=3,
        max_tokens=120)
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls or []
        assert len(calls) == 1 and calls[0].function.name == "get_time"
        valid_call(calls[0])


@pytest.mark.llama_cpp_only(reason=FORCED)
def test_round_trip_call_result_answer(client: OpenAI, fleet: FleetServer) -> None:
    first = client.chat.completions.create(model=fleet.model(), messages=ASK, tools=[WEATHER],  # type: ignore
                                           tool_choice="required", temperature=0.0, max_tokens=120)
    msg = first.choices[0].message
    assert msg.tool_calls
    call = msg.tool_calls[0]
    valid_call(call)
    history = [*ASK, msg.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21, "sky": "clear"})}]
    final = client.chat.completions.create(model=fleet.model(), messages=history, tools=[WEATHER],  # type: ignore
                                           tool_choice="none", temperature=0.0, max_tokens=40)
    answer = final.choices[0]
    assert answer.message.tool_calls is None and answer.message.content
    assert answer.finish_reason in ("stop", "length")
    # the call (content null) and its result were read into the prompt, not refused or dropped
    plain = client.chat.completions.create(model=fleet.model(), messages=ASK, max_tokens=1)  # type: ignore
    result_tokens = len(json.dumps({"temperature_c": 21, "sky": "clear"})) // 4
    assert final.usage is not None and plain.usage is not None
    assert final.usage.prompt_tokens > plain.usage.prompt_tokens + len(call.function.arguments) // 4 + result_tokens


@pytest.mark.llama_cpp_only(reason=FORCED)
def test_streamed_calls_equal_whole_ones(client: OpenAI, fleet: FleetServer) -> None:
    args: dict[str, Any] = dict(model=fleet.model(), messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                temperature=0.0, max_tokens=200)
    whole = client.chat.completions.create(**args).choices[0].message
    with client.beta.chat.completions.stream(**args) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert not streamed.message.content
    # (streamed, the arguments are the model's text as it wrote it; whole, the same JSON, re-serialised)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in streamed.message.tool_calls or []] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in whole.tool_calls or []]


def test_auto_streams_no_call_markup(client: OpenAI, fleet: FleetServer) -> None:
    """With "auto" the tiny model may answer in text or with calls; either way the stream's content never shows
    call markup, and any call it makes is well-formed."""
    for question in (ASK, [{"role": "user", "content": "Call get_weather for Rome, in celsius."}]):
        content, calls = "", []
        for chunk in client.chat.completions.create(model=fleet.model(), messages=question,  # type: ignore
                                                    tools=[WEATHER], temperature=0.0, max_tokens=60, stream=True):
            for c in chunk.choices:
                content += c.delta.content or ""
                calls += c.delta.tool_calls or []
        assert "<tool_call>" not in content and "</tool_call>" not in content
        for call in calls:
            assert call.function is not None and call.function.name == "get_weather"
            json.loads(call.function.arguments or "")


@pytest.mark.parametrize(("extra", "param"), [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 3}}}}}], "tool_choice": "required"}, "tools"),
    ({"response_format": {"type": "json_object"}, "tool_choice": "required"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
])
def test_bad_tool_requests_are_refused(client: OpenAI, fleet: FleetServer, extra: dict[str, Any],
                                       param: str) -> None:
    body = {"tools": [WEATHER], **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=fleet.model(), messages=ASK, max_tokens=5, **body)
    assert e.value.body is not None and param in str(e.value.body), e.value.body


def test_tool_messages_need_their_parts(client: OpenAI, fleet: FleetServer) -> None:
    for bad in ({"role": "tool", "content": "42"}, {"role": "assistant", "content": None},
                {"role": "user", "content": "x", "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=fleet.model(), messages=[*ASK, bad], max_tokens=5)  # type: ignore
