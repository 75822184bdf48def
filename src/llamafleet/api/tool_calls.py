"""Tool calls on the way out: the JSON forms of calls found in a model's text (:func:`parse`; each family's other
formats are :mod:`~llamafleet.api.call_formats`; and :mod:`~llamafleet.api.answer` finds the calls in an answer,
whole or streamed), and the calls as OpenAI's messages and stream deltas carry them.

The JSON forms:

* Hermes 2 Pro / Qwen, and this server's own tools prompt (:mod:`~llamafleet.api.tools`): ``<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>`` blocks anywhere in the answer, the text around them being its content;
* Llama 3.x JSON: the whole answer ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``
  (or Mistral's ``[TOOL_CALLS]``, where a model's vocabulary holds it as text rather than a control token),
  several separated by ``;``;
* generic JSON: the whole answer a ``{"name", "arguments"}`` object, a list of them, or llama.cpp's generic
  ``{"tool_call": {...}}`` / ``{"tool_calls": [...]}``.

A call counts only if it names an offered function and its arguments are a JSON object; anything else stays text, so
an answer that merely talks about JSON is not turned into a call. Pure logic, tested without a model.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from llamafleet.api.protocol import ChatFinish, FunctionCall, ToolCallOut
from llamafleet.engine.types import FinishReason

PYTHON_TAG = "<|python_tag|>"
TOOL_CALLS_TAG = "[TOOL_CALLS]"  # Mistral's; the tag holds ``[``, so an answer opening with it is held like JSON
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_SEPARATORS = " \t\r\n;,"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends function arguments
    id: str | None = None  # the id the model gave it (Mistral, Kimi); None: one is made up


def _call(value: Any, names: Collection[str]) -> ParsedCall | None:
    """``value`` as a call of one of ``names``, or None if it is not one."""
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    args = value.get("arguments", value.get("parameters"))
    if isinstance(args, str):  # some models send the arguments as JSON text, as OpenAI does
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict) or not set(value) <= {"name", "arguments", "parameters", "id", "type"}:
        return None
    return ParsedCall(value["name"], json.dumps(args, ensure_ascii=False))


def json_values(text: str) -> list[Any] | None:
    """The JSON values that make up all of ``text`` (separated by blanks, ``;`` or ``,``), None if anything else."""
    decoder, at = json.JSONDecoder(), 0
    values: list[Any] = []
    while True:
        while at < len(text) and text[at] in _SEPARATORS:
            at += 1
        if at == len(text):
            return values
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return None
        values.append(value)


def _json_calls(text: str, names: Collection[str]) -> list[ParsedCall]:
    """The calls of an answer that is nothing but JSON calls (Llama 3.x and generic forms); [] otherwise."""
    values = json_values(text.strip().removeprefix(PYTHON_TAG).removeprefix(TOOL_CALLS_TAG))
    if not values:
        return []
    items: list[Any] = []
    for v in values:
        if isinstance(v, dict) and isinstance(v.get("tool_calls"), list) and len(v) == 1:
            items += v["tool_calls"]
        elif isinstance(v, dict) and "tool_call" in v and len(v) == 1:
            items.append(v["tool_call"])
        else:
            items += v if isinstance(v, list) else [v]
    calls = [_call(item, names) for item in items]
    return [c for c in calls if c is not None] if items and None not in calls else []


def parse(text: str, names: Collection[str]) -> tuple[str | None, list[ParsedCall]]:
    """The answer's content and its calls of ``names``: content is the text outside the calls (None when there is
    only calls); with no calls, the text unchanged."""
    calls: list[ParsedCall] = []
    rest: list[str] = []
    at = 0
    for m in _BLOCK.finditer(text):
        found = _json_calls(m.group(1), names)
        if len(found) == 1:
            rest.append(text[at:m.start()])
            calls += found
            at = m.end()
    if calls:
        content = "".join([*rest, text[at:]]).strip()
        return content or None, calls
    calls = _json_calls(text, names)
    return (None, calls) if calls else (text, [])


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def calls_out(calls: list[ParsedCall]) -> list[ToolCallOut] | None:
    """A message's ``tool_calls`` (None when it made none); the model's own ids where it wrote them."""
    return [ToolCallOut(id=c.id or call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
            for c in calls] or None


def finish_reason(calls: list[ParsedCall], reason: FinishReason | None) -> ChatFinish | None:
    """OpenAI's ``"tool_calls"`` for an answer that ended with calls."""
    return "tool_calls" if calls and reason == "stop" else reason
