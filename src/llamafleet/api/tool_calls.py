"""Tool calls on the way out: finding them in the model's text, whole (:func:`parse`) or while it streams
(:class:`CallSplitter`).

Models write calls in a few forms; the common ones are recognised:

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
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llamafleet.api.protocol import ChatFinish, FunctionCall, ToolCallDelta, ToolCallOut
from llamafleet.engine.types import FinishReason

if TYPE_CHECKING:
    from llamafleet.api.tools import Tool

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
TOOL_CALLS_TAG = "[TOOL_CALLS]"  # Mistral's; the tag holds ``[``, so an answer opening with it is held like JSON
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_SEPARATORS = " \t\r\n;,"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends function arguments


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


def _json_values(text: str) -> list[Any] | None:
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
    values = _json_values(text.strip().removeprefix(PYTHON_TAG).removeprefix(TOOL_CALLS_TAG))
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


def _partial_open(text: str) -> int:
    """How many of ``text``'s last characters could begin ``<tool_call>``."""
    return next((k for k in range(min(len(text), len(OPEN) - 1), 0, -1) if OPEN.startswith(text[-k:])), 0)


@dataclass
class CallSplitter:
    """One streamed answer, split as it comes into content safe to send now and text held back because it may be
    (the start of) a call, so no call markup reaches the content deltas. An answer that opens like JSON (``{``,
    ``[``, ``<|python_tag|>``) is held to its end, as is everything from ``<tool_call>`` on; :meth:`finish` parses
    what was held."""

    names: Collection[str]
    holding: bool = False  # hold everything from here to the end (a forced call: from the start)
    held: str = ""
    started: bool = False  # some content was sent

    def feed(self, text: str) -> str:
        """Add ``text``; the content that can be sent now."""
        self.held += text
        if self.holding:
            return ""
        if not self.started:
            head = self.held.lstrip()
            if not head or PYTHON_TAG.startswith(head):
                return ""  # not yet known
            if head[0] in "{[" or head.startswith(PYTHON_TAG):
                self.holding = True
                return ""
        at = self.held.find(OPEN)
        if at >= 0:
            self.holding = True
            out, self.held = self.held[:at], self.held[at:]
        else:
            cut = len(self.held) - _partial_open(self.held)
            out, self.held = self.held[:cut], self.held[cut:]
        self.started = self.started or bool(out)
        return out

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """The content still to send and the calls, once the answer is complete."""
        content, calls = parse(self.held, self.names)
        self.held = ""
        return content or "", calls


@dataclass
class CallStreams:
    """The :class:`CallSplitter` of each choice of a streamed request."""

    names: Collection[str]
    forced: bool
    splitters: dict[int, CallSplitter] = field(default_factory=dict)

    @classmethod
    def over(cls, tools: Sequence[Tool], forced: bool) -> CallStreams | None:
        """The splitters for an answer that may call ``tools`` (None when it may call none: nothing to parse)."""
        return cls({t.function.name for t in tools}, forced) if tools else None

    def feed(self, index: int, text: str, finished: bool) -> tuple[str, list[ParsedCall]]:
        """Choice ``index``'s new ``text``: the content to send now and, once ``finished``, its calls."""
        splitter = self.splitters.setdefault(index, CallSplitter(self.names, holding=self.forced))
        content = splitter.feed(text)
        if not finished:
            return content, []
        rest, calls = splitter.finish()
        return content + rest, calls


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def calls_out(calls: list[ParsedCall]) -> list[ToolCallOut] | None:
    """A message's ``tool_calls`` (None when it made none)."""
    return [ToolCallOut(id=call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
            for c in calls] or None


def call_deltas(calls: list[ParsedCall]) -> list[ToolCallDelta] | None:
    """A stream's ``tool_calls`` delta: each call whole, numbered in the answer's order."""
    return [ToolCallDelta(index=i, id=call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
            for i, c in enumerate(calls)] or None


def finish_reason(calls: list[ParsedCall], reason: FinishReason | None) -> ChatFinish | None:
    """OpenAI's ``"tool_calls"`` for an answer that ended with calls."""
    return "tool_calls" if calls and reason == "stop" else reason
