"""An answer split into its reasoning, its content and its tool calls, whole or while it streams.

One :class:`AnswerSplitter` per answer reads the text as it comes and sorts it by the model's family
(:mod:`llamafleet.engine.families`):

* **reasoning**: from the family's think marker at the start (or from the first token, when the prompt opened the
  think block: the worker then starts the answer's text with the open marker) to its close marker; blanks at its
  edges are dropped;
* **calls**: from the first marker that opens a call (or, for JSON call formats, an answer that opens like JSON) to
  the end, held back and read whole at the end (:mod:`~llamafleet.api.call_formats`); what does not read as calls
  goes out as content then, so a malformed call stays text and nothing is lost; a call written inside the think
  block ends the reasoning there. A stream also reads the calls as they come (:mod:`~llamafleet.api.call_stream`):
  each goes out once its function is named, its arguments as they are written, so they can no longer turn into
  text: a streamed call whose arguments break, or are cut by the token limit, stays the call it was (its arguments
  as written, as OpenAI's own calls may be invalid JSON), and the rest of the section is dropped;
* **content**: everything else, sent as soon as it cannot be the start of a marker. Markup that frames an answer
  without being part of it (the family's ``drop``) is removed.

A whole answer is split by the same code (:func:`split`), so whole and streamed answers always agree. The cost is a
few string searches per token, over text that is held back only while it may be a marker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llamafleet.api.call_formats import Schemas, read_calls
from llamafleet.api.call_stream import CallPiece, CallReader
from llamafleet.api.tool_calls import PYTHON_TAG, ParsedCall
from llamafleet.engine.families import Family

if TYPE_CHECKING:
    from llamafleet.api.tools import Tool

GENERIC_OPENERS = ("<tool_call>",)


@dataclass
class Split:
    """What a piece of an answer adds to each part."""

    reasoning: str = ""
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)  # every call of the answer (at its end)
    pieces: list[CallPiece] = field(default_factory=list)  # streamed: the calls' pieces to send now

    def __iadd__(self, other: Split) -> Split:
        self.reasoning += other.reasoning
        self.content += other.content
        self.calls += other.calls
        self.pieces += other.pieces
        return self


def _partial(text: str, markers: Sequence[str]) -> int:
    """How many of ``text``'s last characters could begin one of ``markers``."""
    longest = max((len(m) for m in markers), default=1)
    for k in range(min(len(text), longest - 1), 0, -1):
        tail = text[-k:]
        if any(m.startswith(tail) for m in markers):
            return k
    return 0


def _first(text: str, markers: Sequence[str]) -> tuple[int, str]:
    """Where the first of ``markers`` starts in ``text`` and which it is (the longest of those starting there);
    (-1, "") if none does."""
    best, which = -1, ""
    for m in markers:
        at = text.find(m)
        if at >= 0 and (best < 0 or at < best or (at == best and len(m) > len(which))):
            best, which = at, m
    return best, which


def _whole(calls: list[ParsedCall], first: int) -> list[CallPiece]:
    """``calls`` sent whole, each in one piece, numbered from ``first``."""
    return [CallPiece(i, c.arguments, c.name, c.id) for i, c in enumerate(calls, first)]


@dataclass
class AnswerSplitter:
    family: Family | None
    tools: Schemas  # the functions the answer may call (empty: calls are not looked for)
    forced: bool = False  # the answer must be calls (after its reasoning)
    stream: bool = False  # send each call as it is written (else all are read at the end)
    state: str = "start"  # start, reasoning, content, calls
    held: str = ""
    blanks: str = ""  # the reasoning's trailing blanks, sent only if more reasoning follows
    trim: bool = True  # drop the blanks at the start of the next reasoning or content

    def __post_init__(self) -> None:
        f = self.family
        self.think = f.think if f is not None else None
        self.openers = (f.openers if f is not None else GENERIC_OPENERS) if self.tools else ()
        self.drop = f.drop if f is not None else ()
        self.fmt = f.calls if f is not None else "json"
        self.json_start = bool(self.tools) and self.fmt in ("json", "mistral", "granite")
        self.reader = CallReader(self.fmt if self.stream else "", self.tools)
        self.held = f.lead if f is not None else ""  # (the prompt wrote it: the answer goes on from it)

    def _enter(self, state: str) -> None:
        self.state, self.trim = ("calls" if state == "content" and self.forced else state), True

    def _out(self, out: Split, text: str, part: str) -> None:
        if self.trim:
            text = text.lstrip()
            self.trim = not text
        if part == "content":
            out.content += text
            return
        body = text.rstrip()
        if body:
            out.reasoning += self.blanks + body
            self.blanks = ""
        self.blanks += text[len(body):]

    def _start(self) -> bool:
        """Decide what the answer opens with; False while it cannot be known yet."""
        head = self.held.lstrip()
        if not head:
            return False
        if self.think is not None:
            opener = self.think[0].lstrip()  # (blanks before the answer are dropped, Muse's " to=self" too)
            if head.startswith(opener):
                self.held = head[len(opener):]
                self._enter("reasoning")
                return True
            if opener.startswith(head):
                return False
        if self.json_start:
            if PYTHON_TAG.startswith(head):
                return False  # it may become the tag
            if head[0] in "{[" or head.startswith(PYTHON_TAG):
                self.held = head
                self.state = "calls"
                return True
        self._enter("content")
        return True

    def _scan(self, out: Split) -> bool:
        """Move the held text of the reasoning or content on; True when the state changed."""
        part = self.state
        ends = (self.think[1],) if part == "reasoning" and self.think else ()
        markers = (*ends, *self.openers, *(self.drop if part == "content" else ()))
        at, marker = _first(self.held, markers)
        if at >= 0 and any(len(m) > len(self.held) - at and m.startswith(self.held[at:]) for m in markers):
            at = -1  # a longer marker may be starting there (Functionary v3.2's ">>>all" after its ">>>")
        if at < 0:
            cut = len(self.held) - _partial(self.held, markers)
            self._out(out, self.held[:cut], part)
            self.held = self.held[cut:]
            return False
        self._out(out, self.held[:at], part)
        if marker in self.openers:
            self.held, self.state = self.held[at:], "calls"
            return True
        self.held = self.held[at + len(marker):]
        if marker in ends:
            self.blanks = ""
            self._enter("content")
        return True

    def feed(self, text: str) -> Split:
        """Add ``text``; what can be sent now."""
        self.held += text
        out = Split()
        while self.state != "calls":
            if self.state == "start":
                if not self._start():
                    break
            elif not self._scan(out):
                break
        if self.state == "calls":
            out.pieces += self.reader.read(self.held)
        return out

    def finish(self, cut: bool = False) -> Split:
        """The rest, once the answer is complete (``cut``: by its token limit): the reasoning or content still held,
        and the calls. Calls that do not read are text, unless the answer was cut in them: then they are dropped."""
        out, held = Split(), self.held
        self.held = ""
        if self.state == "calls":
            found = read_calls(self.fmt, held.lstrip(), self.tools)
            last = self.reader.read(held, end=True)  # what the last text completed
            if self.reader.sent:
                streamed = self._streamed(found, cut)
                streamed.pieces[:0] = last
                return streamed
            if found is not None:
                out.calls, rest = found
                out.pieces = _whole(out.calls, 0) if self.stream else []
                out.content = "" if cut else rest  # cut: what follows the last whole call is a call cut short
                return out
            if cut:
                return out
            self.state, self.trim = "content", False  # malformed: it is text after all
        if self.state == "reasoning":
            self._out(out, held, "reasoning")
        else:
            self._out(out, held, "content")
        return out

    def _streamed(self, found: tuple[list[ParsedCall], str] | None, cut: bool) -> Split:
        """The end of a calls section some of whose calls went out as they were written: those stand; the calls the
        whole section holds after them go out whole, and the text after the calls as content, if the section
        reads whole as the same calls (else it is a broken or cut call's rest, dropped)."""
        sent = self.reader.sent
        out = Split(calls=[ParsedCall(c.name, c.arguments, c.id) for c in sent])
        calls, rest = found if found is not None else ([], "")
        if len(calls) < len(sent) or any(c.name != s.name or not s.done for c, s in zip(calls, sent, strict=False)):
            return out
        out.pieces = _whole(calls[len(sent):], len(sent))
        out.calls += calls[len(sent):]
        out.content = "" if cut else rest
        return out


def split(text: str, family: Family | None, tools: Schemas, forced: bool = False, cut: bool = False) -> Split:
    """A whole answer's reasoning, content and calls (content stripped when there are calls)."""
    splitter = AnswerSplitter(family, tools, forced)
    out = splitter.feed(text)
    out += splitter.finish(cut)
    if out.calls:
        out.content = out.content.strip()
    return out


def schemas(tools: Sequence[Tool]) -> dict[str, dict[str, Any]]:
    """The callable functions and their parameters schemas, as the call formats read them."""
    return {t.function.name: t.function.arguments_schema() for t in tools}


@dataclass
class AnswerStreams:
    """The :class:`AnswerSplitter` of each choice of a streamed request."""

    family: Family | None
    tools: Schemas
    forced: bool
    splitters: dict[int, AnswerSplitter] = field(default_factory=dict)

    @classmethod
    def over(cls, family: Family | None, tools: Sequence[Tool], forced: bool) -> AnswerStreams | None:
        """The splitters for answers of a model of ``family`` that may call ``tools``; None when there is nothing to
        split (no tools, no reasoning, no framing markup): the text is the content."""
        if not tools and (family is None or not (family.think or family.drop or family.lead)):
            return None
        return cls(family, schemas(tools), forced)

    def feed(self, index: int, text: str, finished: bool, cut: bool = False) -> Split:
        """Choice ``index``'s new ``text``: what to send now and, once ``finished`` (``cut``: by its token limit),
        the rest and its calls."""
        splitter = self.splitters.get(index)
        if splitter is None:
            splitter = self.splitters[index] = AnswerSplitter(self.family, self.tools, self.forced, stream=True)
        out = splitter.feed(text)
        if finished:
            out += splitter.finish(cut)
        return out

    def whole(self, text: str, cut: bool) -> Split:
        """A whole answer, split (:func:`split`)."""
        return split(text, self.family, self.tools, self.forced, cut)
