"""Tools on the Responses API, translated onto the chat machinery: function tools (flat), ``tool_choice``,
``function_call`` / ``function_call_output`` input items as chat's tool calls and tool messages, and the output items
and stream events of a call, read back by the OpenAI SDK's own models. Pure logic, no model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from llamafleet.api.aggregate import Choice
from llamafleet.api.answer import AnswerStreams
from llamafleet.api.errors import ApiError
from llamafleet.api.openai_requests import ChatCompletionRequest
from llamafleet.api.protocol import PromptTokensDetails, Usage
from llamafleet.api.responses import ResponseRenderer
from llamafleet.api.responses_requests import ResponsesRequest
from llamafleet.api.tools import Serving
from llamafleet.engine.families import FAMILIES
from llamafleet.engine.types import Generation, RequestOutput
from llamafleet.fleet.dispatch import Delta

MODEL = "tiny-model"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
           "strict": True}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
EVENTS: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)


def _request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": MODEL, "input": "Weather in Paris?", **fields})


def test_a_round_trip_is_rendered_as_chat_renders_it() -> None:
    """function_call items (with the assistant text before them) and function_call_output items read exactly as
    chat's assistant tool_calls and tool messages, tools listed the same way."""
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
            "arguments": "{\"city\": \"Paris\"}", "status": "completed"}
    req = _request(tools=[WEATHER], input=[
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Looking.", "annotations": [], "logprobs": []}]},
        call, {**call, "id": "fc_2", "call_id": "call_2", "arguments": "{\"city\": \"Rome\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "18 C"}]}])
    chat = ChatCompletionRequest.model_validate({"model": MODEL, "tools": [CHAT_WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": f"call_{n}", "type": "function",
             "function": {"name": "get_weather", "arguments": f"{{\"city\": \"{c}\"}}"}}
            for n, c in ((1, "Paris"), (2, "Rome"))]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "18 C"}]})
    assert req.turns() == chat.turns()
    assert len(req.turns()) == 5 and "<tools>" in req.turns()[0][1]


@pytest.mark.parametrize(("choice", "forced", "names"), [
    ("auto", False, {"get_weather", "get_time"}),
    ("required", True, {"get_weather", "get_time"}),
    ({"type": "function", "name": "get_time"}, True, {"get_time"}),
    ("none", False, set()),
])
def test_tool_choice_forms(choice: Any, forced: bool, names: set[str]) -> None:
    time_tool = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
    req = _request(tools=[WEATHER, time_tool], tool_choice=choice)
    assert req.forced == forced and {t.function.name for t in req.callable} == names
    grammar = req.sampling().grammar
    assert (grammar is not None) == forced
    if forced:
        assert all(f'\\"{n}\\"' in grammar for n in names), grammar  # type: ignore[operator]
    one = _request(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False).sampling().grammar
    assert one is not None and "{0," not in one  # one call only


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"tools": [{"type": "file_search", "vector_store_ids": ["x"]}]}, "tools[0]", "file_search tools"),
    ({"tools": [WEATHER, {"type": "computer_use_preview"}]}, "tools[1]", "computer_use_preview tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "web_search_preview"}}, "tool_choice", "'web_search_preview'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "no function named"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "unique"),
    ({"tools": [WEATHER], "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "tool_choice",
     "cannot be combined"),
])
def test_refusals_name_the_parameter(fields: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(ApiError) as e:
        req = _request(**fields)
        req.turns()
        req.sampling()
    assert e.value.param == param and words in e.value.message, e.value.message


def _renderer(req: ResponsesRequest) -> ResponseRenderer:
    return ResponseRenderer(req, "resp_1", MODEL, 0, AnswerStreams.over(None, req.callable, req.forced))


def _delta(text: str, finished: bool) -> Delta:
    return Delta(RequestOutput("resp_1", text=text, token_ids=[1], finished=finished,
                               finish_reason="stop" if finished else None,
                               prompt_tokens=5, completion_tokens=3), None)


def _shape(item: Any) -> dict[str, Any]:
    """An output item without its ids (new ones each time) and the blanks around its text (a stream sends the text
    before a call as it comes; the whole answer strips it)."""
    out = {k: v for k, v in item.model_dump().items() if k not in ("id", "call_id")}
    for part in out.get("content", []):
        part["text"] = part["text"].strip()
    return out


USAGE = Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8, prompt_tokens_details=PromptTokensDetails(
    cached_tokens=0))


@pytest.mark.parametrize("answer", [
    "Sure. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "It is sunny.",
])
def test_streamed_events_are_the_sdks_and_end_as_the_whole_response(answer: str) -> None:
    req = _request(tools=[WEATHER])
    render = _renderer(req)
    events = [*render.opening(1)]
    half = len(answer) // 2
    events += render.chunk(0, _delta(answer[:half], False)) + render.chunk(0, _delta(answer[half:], True))
    events += render.closing(USAGE)
    parsed = [EVENTS.validate_python(json.loads(e.model_dump_json())) for e in events]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    final = parsed[-1]
    assert final.type == "response.completed"
    streamed_text = "".join(e.delta for e in parsed if e.type == "response.output_text.delta")
    assert "<tool_call>" not in streamed_text and final.response.output_text == streamed_text
    choice = Choice(Generation("resp_1"))
    choice.add(_delta(answer, True))
    whole = Response.model_validate(_renderer(req).whole([choice], USAGE).model_dump())
    assert [_shape(i) for i in whole.output] == [_shape(i) for i in final.response.output]
    calls = [i for i in final.response.output if i.type == "function_call"]
    if "tool_call" in answer:
        (call,) = calls
        assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
        assert call.call_id.startswith("call_") and call.status == "completed"
        kinds = [e.type for e in parsed if getattr(e, "item_id", None) == call.id or
                 getattr(getattr(e, "item", None), "id", None) == call.id]
        assert kinds == ["response.output_item.added", "response.function_call_arguments.delta",
                         "response.function_call_arguments.done", "response.output_item.done"]
        added = next(e for e in parsed if e.type == "response.output_item.added" and e.item.type == "function_call")
        assert added.item.arguments == "" and added.item.status == "in_progress"  # type: ignore[union-attr]
        assert added.output_index == len(final.response.output) - 1
    else:
        assert not calls
    assert bool(streamed_text) == any(i.type == "message" for i in final.response.output)


def test_logprobs_of_held_back_text_ride_on_the_next_text_delta() -> None:
    """With tools, text that may start a call is held back; its tokens' logprobs wait for the text delta that
    finally carries it, so the deltas' logprobs always add up to the streamed text."""
    render = _renderer(_request(tools=[WEATHER], include=["message.output_text.logprobs"]))
    render.opening(1)
    steps = [("Hi <", False), ("tool", False), (" no.", True)]  # "<" then "<tool" could open <tool_call>
    events = []
    for n, (text, finished) in enumerate(steps):
        out = RequestOutput("resp_1", text=text, token_ids=[n], logprobs=[-0.5 * (n + 1)], finished=finished,
                            finish_reason="stop" if finished else None)
        events += render.chunk(0, Delta(out, [text.encode()]))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == "Hi <tool no."  # type: ignore[attr-defined]
    assert [len(e.logprobs) for e in deltas] == [1, 2]  # type: ignore[attr-defined]
    assert "".join(lp.token for e in deltas for lp in e.logprobs) == "Hi <tool no."  # type: ignore[attr-defined]


def _streamed(render: ResponseRenderer, answer: str, step: int) -> list[Any]:
    """The events of ``answer`` streamed ``step`` characters at a time, as the SDK reads them."""
    events = [*render.opening(1)]
    for i in range(0, len(answer), step):
        events += render.chunk(0, _delta(answer[i:i + step], i + step >= len(answer)))
    events += render.closing(USAGE)
    return [EVENTS.validate_python(json.loads(e.model_dump_json())) for e in events]


def test_reasoning_is_an_item_before_the_message_streamed_and_whole() -> None:
    req = _request(tools=[WEATHER])
    answer = ("<think>\nLet me see.\n</think>\n\nSure. <tool_call>\n"
              "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>")
    answers = AnswerStreams.over(FAMILIES["qwen3"], req.callable, req.forced)
    parsed = _streamed(ResponseRenderer(req, "resp_1", MODEL, 0, answers), answer, 9)
    final = parsed[-1].response  # type: ignore[union-attr]
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[0].content[0].text == "Let me see."  # type: ignore[union-attr,index]
    thought = "".join(e.delta for e in parsed if e.type == "response.reasoning_text.delta")  # type: ignore[union-attr]
    assert thought == "Let me see."
    added = [(e.output_index, e.item.type) for e in parsed if e.type == "response.output_item.added"]  # type: ignore
    assert added == [(0, "reasoning"), (1, "message"), (2, "function_call")]
    assert {e.output_index for e in parsed if e.type == "response.output_text.delta"} == {1}  # type: ignore
    choice = Choice(Generation("resp_1"))
    choice.add(_delta(answer, True))
    whole = Response.model_validate(ResponseRenderer(req, "resp_1", MODEL, 0, answers).whole([choice], USAGE)
                                    .model_dump())
    assert [_shape(i) for i in whole.output] == [_shape(i) for i in final.output]


def test_reasoning_items_sent_back_go_with_the_assistant_turn_after_them() -> None:
    req = _request(input=[
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "21 C"},
    ], tools=[WEATHER])
    assert [m.reasoning_content for m in req.messages] == [None, "Call.", None]
    assert [i["type"] for i in req.input_items()] == ["message", "reasoning", "function_call", "function_call_output"]


def test_streamed_call_arguments_grow_and_items_keep_the_index_they_were_added_at() -> None:
    """Two calls streamed a few characters at a time, then text after them: each call's item is added when its
    function is named, its arguments come in several deltas at its own output index, and the finished response
    lists the items in the order (and at the indices) the stream added them."""
    call = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{}"}}}}\n</tool_call>\n'
    answer = call.format("Paris") + call.format("Oslo") + "Done."
    parsed = _streamed(_renderer(_request(tools=[WEATHER])), answer, 4)
    final = parsed[-1].response  # type: ignore[union-attr]
    assert [i.type for i in final.output] == ["function_call", "function_call", "message"]
    assert final.output_text == "Done."
    for at, item in enumerate(final.output[:2]):
        deltas = [e for e in parsed if e.type == "response.function_call_arguments.delta" and e.item_id == item.id]
        assert len(deltas) > 2 and {e.output_index for e in deltas} == {at}
        assert "".join(e.delta for e in deltas) == item.arguments  # type: ignore[union-attr]
    assert [json.loads(i.arguments)["city"] for i in final.output[:2]] == ["Paris", "Oslo"]  # type: ignore[union-attr]
    added = [e.output_index for e in parsed if e.type == "response.output_item.added"]
    assert added == [0, 1, 2]


@pytest.mark.parametrize(("reasoning", "budget"), [
    ({"effort": "low", "max_tokens": 7}, 7), ({}, 5), ({"max_tokens": 0}, "400"), ({"max_tokens": 41}, "400"),
    ({"max_tokens": "7"}, "400"), ({"max_tokens": True}, "400"),
])
def test_the_reasoning_budget_is_reasoning_max_tokens_or_the_servers(reasoning: dict[str, Any],
                                                                       budget: int | str) -> None:
    """``reasoning.max_tokens`` (OpenRouter's name) is the budget the engine closes the think block after, as chat's
    ``reasoning_budget``; from 1 to ``max_output_tokens`` (else a 400 naming it); without it, the server's."""
    req = _request(reasoning=reasoning, max_output_tokens=40)
    req.served_by(Serving(FAMILIES["qwen3"], reasoning_budget=5))
    if budget == "400":
        with pytest.raises(ApiError) as e:
            req.sampling()
        assert e.value.param == "reasoning.max_tokens"
    else:
        assert req.sampling().think_budget == budget
