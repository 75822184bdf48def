"""Tools on ``/v1/responses`` through a real ``llamafleet serve``, with the OpenAI SDK's ``client.responses``: forced
calls (``tool_choice`` "required" and a named function) come back as ``function_call`` items whose arguments follow
the schema; a full round-trip (call -> ``function_call_output`` -> answer) sending the response's own output items
back as input; a streamed call, read by the SDK's event models, equal to the whole one at temperature 0; hosted tools
refused by their type."""

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
    "type": "function", "name": "get_weather", "description": "The current weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False},
}
TIME: dict[str, Any] = {
    "type": "function", "name": "get_time", "description": "The time now in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}}, "required": ["zone"]},
}
ASK = "What is the weather in Paris?"


def calls_of(response: Any) -> list[Any]:
    """The response's function_call items, each checked against its function's schema."""
    calls = [item for item in response.output if item.type == "function_call"]
    for call in calls:
        assert call.call_id.startswith("call_") and call.id.startswith("fc_") and call.status == "completed"
        args = json.loads(call.arguments)
        if call.name == "get_weather":
            assert set(args) == {"city", "unit"} and len(args["city"]) <= 24, args
            assert args["unit"] in ("celsius", "fahrenheit")
        else:
            assert call.name == "get_time" and set(args) == {"zone"}, call
    return calls


@pytest.mark.llama_cpp_only(reason=FORCED)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_gives_function_call_items(client: OpenAI, model: str, temperature: float) -> None:
    # sampled, one call: with parallel calls allowed the demo model may go on calling until max_output_tokens
    # (then the response is rightly "incomplete"), which no seed on this route can rule out
    r = client.responses.create(model=model, input=ASK, tools=[WEATHER, TIME], tool_choice="required",  # type: ignore
                                temperature=temperature, max_output_tokens=200,
                                parallel_tool_calls=temperature == 0.0)
    assert r.status == "completed", r
    assert calls_of(r) and all(item.type == "function_call" for item in r.output)  # no message: calls alone
    assert r.output_text == ""
    assert r.tool_choice == "required" and [t.name for t in r.tools] == ["get_weather", "get_time"]  # type: ignore


@pytest.mark.llama_cpp_only(reason=FORCED)
def test_named_function_is_the_one_called(client: OpenAI, model: str) -> None:
    r = client.responses.create(model=model, input=ASK, tools=[WEATHER, TIME],  # type: ignore[list-item]
                                tool_choice={"type": "function", "name": "get_time"}, temperature=1.0,
                                max_output_tokens=120)
    (call,) = calls_of(r)
    assert call.name == "get_time"


@pytest.mark.llama_cpp_only(reason=FORCED)
def test_round_trip_call_output_answer(client: OpenAI, model: str) -> None:
    first = client.responses.create(model=model, input=ASK, tools=[WEATHER], tool_choice="required",  # type: ignore
                                    parallel_tool_calls=False, temperature=0.0, max_output_tokens=120)
    (call,) = calls_of(first)
    result = json.dumps({"temperature_c": 21, "sky": "clear"})
    history: list[Any] = [{"role": "user", "content": ASK}, *first.output,
                          {"type": "function_call_output", "call_id": call.call_id, "output": result}]
    final = client.responses.create(model=model, input=history, tools=[WEATHER],  # type: ignore[list-item]
                                    tool_choice="none", temperature=0.0, max_output_tokens=40)
    assert final.output_text and not calls_of(final)
    assert [item.type for item in final.output] == ["message"]
    # the call and its result were read into the prompt, not refused or dropped
    plain = client.responses.create(model=model, input=ASK, max_output_tokens=1)
    assert final.usage is not None and plain.usage is not None
    assert final.usage.input_tokens > plain.usage.input_tokens + len(call.arguments) // 4 + len(result) // 4


@pytest.mark.llama_cpp_only(reason=FORCED)
def test_streamed_call_equals_the_whole_one(client: OpenAI, model: str) -> None:
    args: dict[str, Any] = dict(model=model, input=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                temperature=0.0, max_output_tokens=200)
    whole = client.responses.create(**args)
    events = list(client.responses.create(**args, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert "response.output_text.delta" not in kinds and "response.content_part.added" not in kinds
    assert kinds[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    final: Any = events[-1]
    streamed = calls_of(final.response)
    # (streamed, the arguments are the model's text as it wrote it; whole, the same JSON, re-serialised)
    assert [(c.name, json.loads(c.arguments)) for c in streamed] == \
        [(c.name, json.loads(c.arguments)) for c in calls_of(whole)]
    assert deltas == "".join(done) == "".join(c.arguments for c in streamed)
    assert len([e for e in events if e.type == "response.function_call_arguments.delta"]) > len(streamed)


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tools": [{**WEATHER, "name": "bad name"}]}, "tools"),
])
def test_bad_tool_requests_are_refused(client: OpenAI, fleet: FleetServer, extra: dict[str, Any],
                                       param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=fleet.model(), input=ASK, max_output_tokens=5, **extra)
    assert e.value.body is not None and param in str(e.value.body), e.value.body
