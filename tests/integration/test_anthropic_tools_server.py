"""Tools on Anthropic's ``/v1/messages`` through a real ``llamafleet serve`` with the Anthropic SDK: forced calls
(``tool_choice`` ``any`` and ``tool``) are well-formed ``tool_use`` blocks whose input follows the tool's
``input_schema``; a round trip (``tool_use`` -> ``tool_result`` -> a text answer with ``tool_choice`` ``none``); a
streamed call, assembled by the SDK's stream helper, equals the whole answer at temperature 0; and ``count_tokens``
counts the tools section."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from conftest import FleetServer

pytestmark = pytest.mark.each_engine
FORCED = "the call is forced with a grammar (tool_choice any, required or named), which the torch engine refuses"

WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {"type": "object",
                     "properties": {"city": {"type": "string", "maxLength": 24},
                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                     "required": ["city", "unit"], "additionalProperties": False},
}
TIME: dict[str, Any] = {
    "name": "get_time", "description": "The time now in a time zone.",
    "input_schema": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}},
                     "required": ["zone"], "additionalProperties": False},
}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def claude(fleet: FleetServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=fleet.url, api_key="unused", max_retries=0, timeout=120.0) as sdk:
        yield sdk


def valid_use(block: Any) -> dict[str, Any]:
    """A tool_use block's input, checked against its tool's input_schema."""
    assert block.type == "tool_use" and block.id.startswith("toolu_"), block
    args = dict(block.input)
    if block.name == "get_weather":
        assert set(args) == {"city", "unit"}, args
        assert isinstance(args["city"], str) and len(args["city"]) <= 24
        assert args["unit"] in ("celsius", "fahrenheit")
    else:
        assert block.name == "get_time", block.name
        assert set(args) == {"zone"} and isinstance(args["zone"], str) and len(args["zone"]) <= 24, args
    return args


@pytest.mark.llama_cpp_only(reason=FORCED)
@pytest.mark.parametrize(("temperature", "one"), [(0.0, False), (1.0, True)])
def test_any_gives_well_formed_calls(claude: anthropic.Anthropic, fleet: FleetServer, temperature: float,
                                     one: bool) -> None:
    """At temperature 1 the calls are limited to one (there is no seed, and up to 8 random calls can outrun the
    token limit, which is answered as text with ``max_tokens``)."""
    msg = claude.messages.create(model=fleet.model(), max_tokens=200, messages=ASK, tools=[WEATHER, TIME],
                                 tool_choice={"type": "any", "disable_parallel_tool_use": one},
                                 extra_body={"temperature": temperature})
    assert msg.stop_reason == "tool_use", msg
    assert msg.content and all(b.type == "tool_use" for b in msg.content)
    assert len(msg.content) == 1 or not one
    for block in msg.content:
        valid_use(block)


@pytest.mark.llama_cpp_only(reason=FORCED)
def test_tool_calls_the_named_tool_once(claude: anthropic.Anthropic, fleet: FleetServer) -> None:
    msg = claude.messages.create(model=fleet.model(), max_tokens=200, messages=ASK, tools=[WEATHER, TIME],
                                 tool_choice={"type": "tool", "name": "get_time"}, extra_body={"temperature": 1.0})
    assert msg.stop_reason == "tool_use"
    (block,) = msg.content
    assert block.type == "tool_use" and block.name == "get_time"
    valid_use(block)


@pytest.mark.llama_cpp_only(reason=FORCED)
def test_round_trip(claude: anthropic.Anthropic, fleet: FleetServer) -> None:
    model = fleet.model()
    call = claude.messages.create(model=model, max_tokens=200, messages=ASK, tools=[WEATHER],
                                  tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    (use,) = call.content
    assert use.type == "tool_use"
    history: list[Any] = [*ASK, {"role": "assistant", "content": call.content},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                        "content": "Sunny, 24 degrees."}]}]
    final = claude.messages.create(model=model, max_tokens=40, messages=history, tools=[WEATHER],
                                   tool_choice={"type": "none"}, extra_body={"temperature": 0})
    assert final.stop_reason in ("end_turn", "max_tokens")
    (text,) = final.content
    assert text.type == "text" and text.text.strip()
    def read(msg: Any) -> int:  # the prompt's tokens, computed or read from the prefix cache
        return int(msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0))

    bare = claude.messages.count_tokens(model=model, messages=ASK).input_tokens
    assert read(final) > bare + 20  # "none" shows no tools, but the call and its result were read


@pytest.mark.llama_cpp_only(reason=FORCED)
@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "auto"}])
def test_stream_matches_the_whole_answer(claude: anthropic.Anthropic, fleet: FleetServer,
                                         choice: dict[str, Any]) -> None:
    args: dict[str, Any] = {"model": fleet.model(), "max_tokens": 120, "messages": ASK, "tools": [WEATHER, TIME],
                            "tool_choice": choice, "extra_body": {"temperature": 0}}
    # warms the prefix cache (a prompt read from it can tip a close choice otherwise): one token caches the prompt
    claude.messages.create(**{**args, "max_tokens": 1})
    whole = claude.messages.create(**args)
    with claude.messages.stream(**args) as stream:
        streamed = stream.get_final_message()

    def shape(msg: Any) -> list[Any]:
        return [(b.type, b.name, b.input) if b.type == "tool_use" else (b.type, b.text) for b in msg.content]

    assert shape(streamed) == shape(whole) and streamed.stop_reason == whole.stop_reason
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    if choice["type"] == "any":
        assert whole.stop_reason == "tool_use" and [valid_use(b) for b in streamed.content]


@pytest.mark.llama_cpp_only(reason=FORCED)
def test_count_tokens_counts_the_tools(claude: anthropic.Anthropic, fleet: FleetServer) -> None:
    model = fleet.model()
    bare = claude.messages.count_tokens(model=model, messages=ASK)
    tooled = claude.messages.count_tokens(model=model, messages=ASK, tools=[WEATHER])
    assert tooled.input_tokens > bare.input_tokens + 50  # the tools section and WEATHER's schema
    msg = claude.messages.create(model=model, max_tokens=1, messages=ASK, tools=[WEATHER],
                                 tool_choice={"type": "any"})
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == tooled.input_tokens  # as served
    none = claude.messages.count_tokens(model=model, messages=ASK, tools=[WEATHER], tool_choice={"type": "none"})
    assert none.input_tokens == bare.input_tokens  # "none": the tools are not shown
