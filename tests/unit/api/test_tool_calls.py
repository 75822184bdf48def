"""Tool calls without a model: rendering tools and past calls into chat turns, the forced-call grammar's shape (the
server tests sample under it with llama.cpp), and parsing each output format, whole and streamed in every split."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llamafleet.api.answer import AnswerSplitter, AnswerStreams, Split
from llamafleet.api.call_stream import CallPiece, call_deltas
from llamafleet.api.errors import ApiError
from llamafleet.api.openai_requests import ChatCompletionRequest
from llamafleet.api.tool_calls import ParsedCall, parse
from llamafleet.api.tools import TOOLS_HEADER, Function, Tool, calls_grammar
from llamafleet.engine.grammar import check_gbnf

NAMES = ("get_weather", "get_time")
WEATHER = ParsedCall("get_weather", '{"city": "Paris"}')
TIME = ParsedCall("get_time", '{"zone": "UTC"}')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time"}}]


def chat(**body: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", **body})


@pytest.mark.parametrize(("text", "content", "calls"), [
    # Hermes / Qwen blocks, with text around them, several, unterminated at the end
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None, [WEATHER]),
    ('Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
     '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>', "Let me check.", [WEATHER, TIME]),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}', None, [WEATHER]),
    # arguments sent as JSON text
    ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>', None, [WEATHER]),
    # Llama 3.x: parameters, the python tag, several separated by ;
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [WEATHER]),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
     '{"name": "get_time", "parameters": {"zone": "UTC"}}', None, [WEATHER, TIME]),
    # Mistral: its tag (when it is text, not a control token) before a list
    ('[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}]', None, [TIME]),
    # generic JSON: a list, llama.cpp's tool_call / tool_calls wrappers
    (' [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"zone": "UTC"}}]',
     None, [WEATHER, TIME]),
    ('{"tool_call": {"name": "get_time", "arguments": {"zone": "UTC"}}}', None, [TIME]),
    ('{"tool_calls": [{"name": "get_time", "arguments": {"zone": "UTC"}}]}', None, [TIME]),
])
def test_calls_are_found_in_each_format(text: str, content: str | None, calls: list[ParsedCall]) -> None:
    assert parse(text, NAMES) == (content, calls)


@pytest.mark.parametrize("text", [
    "It is sunny in Paris.",
    '{"city": "Paris"}',  # JSON, but no call
    '{"name": "delete_everything", "arguments": {}}',  # a function that was not offered
    '{"name": "get_weather", "arguments": [1, 2]}',  # arguments that are no object
    '{"name": "get_weather", "arguments": {"city": "Paris"}} and then some text',
    '[{"name": "get_weather", "arguments": {}}, {"name": "other", "arguments": {}}]',  # not all calls
    '<tool_call>not json</tool_call>',
    "",
])
def test_text_that_is_no_call_stays_content(text: str) -> None:
    assert parse(text, NAMES) == (text, [])


def test_a_broken_block_stays_in_the_content_beside_good_ones() -> None:
    text = '<tool_call>oops</tool_call> <tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
    assert parse(text, NAMES) == ("<tool_call>oops</tool_call>", [TIME])


@pytest.mark.parametrize("text", [
    'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "Plain text: a < b, and <tool is no tag; {braces} later.",
    "<tool_call>broken",
])
@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_streamed_splits_never_leak_markup_and_agree_with_whole(text: str, step: int) -> None:
    splitter = AnswerSplitter(None, dict.fromkeys(NAMES, {}))
    sent = "".join(splitter.feed(text[i:i + step]).content for i in range(0, len(text), step))
    end = splitter.finish()
    rest, calls = end.content, end.calls
    content, whole_calls = parse(text, NAMES)
    assert calls == whole_calls
    if calls:
        assert "<tool_call>" not in sent + rest and "python_tag" not in sent + rest and "TOOL_CALLS" not in sent + rest
        assert (sent + rest).strip() == (content or "")
    else:
        assert sent + rest == text


def test_forced_streams_hold_everything_and_each_choice_is_its_own() -> None:
    streams = AnswerStreams(None, dict.fromkeys(NAMES, {}), forced=True)
    block = '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'
    assert streams.feed(0, block[:20], False) == Split()
    assert streams.feed(1, "plain", True) == Split(content="plain")
    whole = Split(calls=[TIME], pieces=[CallPiece(0, '{"zone": "UTC"}', "get_time")])  # named, arguments so far
    assert streams.feed(0, block[20:], True) == whole


def test_tools_are_listed_in_the_system_prompt_and_history_is_rendered_as_text() -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
    ]
    turns = chat(messages=messages, tools=TOOLS).turns()
    assert [r for r, _ in turns] == ["system", "user", "assistant", "user"]
    system = turns[0][1]
    assert system.startswith("Be brief.\n\n" + TOOLS_HEADER)
    listed = [json.loads(line) for line in system.splitlines() if line.startswith('{"type": "function"')]
    assert listed == TOOLS
    assert turns[2][1] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert turns[3][1] == "<tool_response>\n21 C\n</tool_response>"
    # no system message: one is added; "none": the tools are not listed, the history still is
    assert chat(messages=messages[1:], tools=TOOLS).turns()[0] == ("system", system.removeprefix("Be brief.\n\n"))
    assert chat(messages=messages, tools=TOOLS, tool_choice="none").turns()[0] == ("system", "Be brief.")
    named = chat(messages=messages[1:2], tools=TOOLS,
                 tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert "get_weather" not in named.turns()[0][1] and named.forced


def test_forced_choices_sample_under_the_calls_grammar_and_auto_does_not() -> None:
    ask = [{"role": "user", "content": "hi"}]
    assert chat(messages=ask, tools=TOOLS).constraint is None
    assert chat(messages=ask, tools=TOOLS, tool_choice="none").constraint is None
    required = chat(messages=ask, tools=TOOLS, tool_choice="required").constraint
    assert required is not None and "{0,7}" in required and '"\\"get_time\\""' in required
    single = chat(messages=ask, tools=TOOLS, tool_choice="required", parallel_tool_calls=False).constraint
    assert single is not None and "{0,7}" not in single


def test_calls_grammar_wraps_the_schema_rules_under_one_root() -> None:
    tools = [Tool.model_validate(t) for t in TOOLS]
    grammar = calls_grammar(tools, many=True)
    check_gbnf(grammar)
    assert grammar.startswith('root ::= call ("\\n" call){0,7}\n') and grammar.count("\nroot ::=") == 0
    assert 'call ::= "<tool_call>\\n" c-root "\\n</tool_call>"' in grammar and "c-root ::= " in grammar


def test_unenforceable_schema_is_refused_for_forced_calls_only() -> None:
    bad = Tool(type="function", function=Function(name="f", parameters={
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}))
    with pytest.raises(ApiError, match="'minimum'"):
        calls_grammar([bad], many=False)
    ask = [{"role": "user", "content": "hi"}]
    assert chat(messages=ask, tools=[bad.model_dump(exclude_none=True)]).constraint is None  # auto: not enforced


def test_streamed_call_pieces_carry_id_and_name_first_then_arguments_alone() -> None:
    """As OpenAI streams a call: its first delta has the index, id, type and name; the next ones the index and the
    next piece of the arguments only (no null name that a client would append)."""
    pieces = [CallPiece(0, '{"zone"', "get_time", "abc"), CallPiece(0, ': "UTC"}'), CallPiece(1, "{}", "get_time")]
    deltas = [json.loads(d.model_dump_json()) for d in call_deltas(pieces) or []]
    assert deltas[0] == {"index": 0, "id": "abc", "type": "function",
                         "function": {"name": "get_time", "arguments": '{"zone"'}}
    assert deltas[1] == {"index": 0, "function": {"arguments": ': "UTC"}'}}
    assert deltas[2]["index"] == 1 and deltas[2]["id"].startswith("call_")
