"""Rendering with a model's own Jinja chat template (engine/template.py): which templates count as showing tools,
and that they render as Hugging Face renders them (``tojson``'s arguments, ``bos_token``, ``raise_exception``,
``strftime_now``, the loop-control extension), inside Jinja's immutable sandbox. The templates are tests/
tool_templates.py's, written in the style of real families. Pure logic, no model."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from llamafleet.api.openai_requests import ChatCompletionRequest
from llamafleet.engine.template import ChatTemplate, TemplateFailed, shows_tools, tool_template
from llamafleet.model.synth import CHAT_TEMPLATE
from tool_templates import CHATML_TOOLS, HEADER_TOOLS

# the demo model's (SmolLM2) template, in its shape: ChatML turns, no tools
PLAIN_CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                "{% endif %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city, e.g. Zürich.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def _chat(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
    """The conversation a chat request sends for templates (api/openai_requests.py's translation)."""
    chat = ChatCompletionRequest.model_validate({"model": "m", "messages": messages, "tools": tools}).tool_chat()
    assert chat is not None
    return chat


ROUND_TRIP = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
]


@pytest.mark.parametrize(("source", "shows"), [
    (CHATML_TOOLS, True), (HEADER_TOOLS, True), (PLAIN_CHATML, False), (CHAT_TEMPLATE, False),
    ("{{ 'these tools are words, not a variable' }}", False),  # the text "tools" is not the variable
    ("{% for m in messages %}{% if tools is defined %}x{% endif %}{% endfor %}", True),
    ("{% for m in messages %}", False),  # does not parse
])
def test_shows_tools_reads_the_template_not_its_text(source: str, shows: bool) -> None:
    assert shows_tools(source) is shows
    assert (tool_template(source, "<s>", "</s>", True) is not None) is shows


def test_chatml_style_round_trip() -> None:
    chat = _chat(ROUND_TRIP, [WEATHER])
    text = ChatTemplate(CHATML_TOOLS, "", "<|im_end|>", strip_bos=False).render(chat.messages, chat.tools)
    tool_json = json.dumps(WEATHER, ensure_ascii=False)
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Functions\n\nCall a function when it helps. Signatures:\n<tools>\n"
        f"{tool_json}\n</tools>\n\nA call is <tool_call>\n{{\"name\": <name>, \"arguments\": <object>}}\n</tool_call>"
        "<|im_end|>\n<|im_start|>user\nWeather in Zürich?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n"
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")  # tojson as HF's: no ASCII escapes ("Zürich"), no HTML escapes


def test_header_style_round_trip() -> None:
    chat = _chat(ROUND_TRIP, [WEATHER])
    template = ChatTemplate(HEADER_TOOLS, "<|begin_of_text|>", "<|eot_id|>", strip_bos=True)
    text = template.render(chat.messages, chat.tools)
    assert text.startswith("<|start_header_id|>system")  # the tokenizer adds BOS itself: not written twice
    assert f"Today Date: {time.strftime('%d %b %Y')}" in text  # strftime_now
    assert json.dumps(WEATHER, indent=4, ensure_ascii=False) in text  # tojson(indent=4)
    assert "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Zürich\"}}<|eot_id|>" in text
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n21 C<|eot_id|>" in text
    kept = ChatTemplate(HEADER_TOOLS, "<|begin_of_text|>", "<|eot_id|>", strip_bos=False)
    assert kept.render(chat.messages, chat.tools) == "<|begin_of_text|>" + text


def test_tool_results_name_their_function_and_no_tools_is_none() -> None:
    chat = _chat(ROUND_TRIP, [])  # tool_choice none or no tools: calls and results are still the template's
    assert chat.tools == () and chat.messages[3] == {"role": "tool", "content": "21 C", "tool_call_id": "call_1",
                                                     "name": "get_weather"}
    assert chat.messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Zürich"}  # an object, as HF's
    text = ChatTemplate(CHATML_TOOLS, "", "", False).render(chat.messages, chat.tools)
    assert "<tools>" not in text and "<tool_response>\n21 C" in text
    plain = ChatCompletionRequest.model_validate({"model": "m", "messages": ROUND_TRIP[:2]})
    assert plain.tool_chat() is None  # nothing about tools: rendered as any chat


@pytest.mark.parametrize(("source", "words"), [
    (HEADER_TOOLS, "refused this conversation: only one tool call per turn"),  # raise_exception
    ("{{ messages.append(1) }}", "SecurityError"),  # the immutable sandbox
    ("{{ messages[0].content.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
    ("{{ messages[0].content + 1 }}", "TypeError"),
])
def test_template_failures_are_value_errors(source: str, words: str) -> None:
    two = [*ROUND_TRIP[:2], {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}} for i in (1, 2)]}]
    chat = _chat(two, [WEATHER])
    with pytest.raises(TemplateFailed, match=words) as e:
        ChatTemplate(source, "", "", False).render(chat.messages, chat.tools)
    assert isinstance(e.value, ValueError)  # the worker answers it with a 400


def test_loop_controls_as_hf_enables_them() -> None:
    source = "{% for m in messages %}{% if m.role == 'tool' %}{% break %}{% endif %}[{{ m.role }}]{% endfor %}"
    chat = _chat(ROUND_TRIP, [])
    assert ChatTemplate(source, "", "", False).render(chat.messages) == "[system][user][assistant]"
