"""Tool calls read while they stream (:class:`CallReader`): each call goes out as soon as its function's name is read,
and its arguments follow as the model writes them, so a client sees ``function.arguments`` grow as OpenAI streams it.

The reader walks the calls section (:mod:`~llamafleet.api.answer` holds it) with each family's call shape: the
*header* that names the function (and holds the call's id where the family writes one), then the *arguments*:

* ``json``: a JSON object, sent as the model writes it, character by character, to the end of the object (strings,
  escapes and nesting followed; a ``<`` outside a string breaks it: markup never goes out as arguments);
* ``params``: the XML-like formats (Qwen3-Coder, GLM) write one parameter at a time; each goes out once its closing
  tag is read, as the JSON member it becomes (its text read as its schema wants: :func:`typed`, or MiniMax M3's
  nested elements: :func:`m3_value`), so the arguments are the same text as a whole answer's.

Between calls, the *gap* skips what closes one call and opens the next. Whatever else the section holds (a call
whose arguments come before its name, a list of calls, a format without a shape here, such as Mistral Nemo's whose
ids follow the arguments) stops the reader: the rest is read whole when the answer ends
(:mod:`~llamafleet.api.call_formats`), and its calls then go out whole. A call is sent only if it names an offered
function and its arguments start as an object; it goes out with the first piece of its arguments (a parameter
never closed sends nothing). Pure logic.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llamafleet.api.protocol import FunctionDelta, ToolCallDelta
from llamafleet.api.tool_calls import ParsedCall, call_id
from llamafleet.engine.families import M3

_NAME = r'\{\s*"name"\s*:\s*"(?P<name>[^"\\]+)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)'
_DS_END = "<｜tool▁call▁end｜>"
_KIMI_ID = r"(?P<id>(?:[^\s<.]*\.)?(?P<name>[^\s<:]+)(?::\d+)?)"


@dataclass(frozen=True)
class Shape:
    """How one family writes a call, as far as it can be read while it streams."""

    start: re.Pattern[str]  # a header (after the gap), naming the function (group ``name``), its id (group ``id``)
    gap: re.Pattern[str]  # what may stand before a header, or after the last call (then not part of the content)
    param: re.Pattern[str] | None = None  # params: one parameter (``key``, ``value``), complete with its closing tag
    close: re.Pattern[str] | None = None  # params: what ends the call (group ``args``: its arguments, whole)
    ends: tuple[str, ...] = ()  # params: the tags that end a parameter or the call (only they can complete one)
    value: Callable[[str, Any], Any] | None = None  # params: a parameter's text as its value (default: typed)


def _shape(gap: str, header: str, param: str = "", close: str = "", ends: tuple[str, ...] = (),
           value: Callable[[str, Any], Any] | None = None) -> Shape:
    """``gap``: blanks and the markup that closes a call or opens or closes the section."""
    return Shape(re.compile(f"(?:{gap})*(?:{header})", re.DOTALL), re.compile(f"(?:{gap})*"),
                 re.compile(param, re.DOTALL) if param else None, re.compile(close, re.DOTALL) if close else None,
                 ends, value)


def kinds(schema: Any) -> set[str]:
    """The JSON types a schema allows (its ``type``, or those of its ``anyOf`` / ``oneOf`` alternatives); empty
    when it says none."""
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    found = {kind} if isinstance(kind, str) else {k for k in kind if isinstance(k, str)} if isinstance(kind, list) \
        else set()
    for key in ("anyOf", "oneOf"):
        for alt in schema.get(key) or []:
            found |= kinds(alt)
    return found


def typed(value: str, schema: Any) -> Any:
    """A parameter's text as the value its schema wants: text for strings (or no schema), JSON otherwise."""
    allowed = kinds(schema)
    if not allowed or "string" in allowed:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


_CDATA = re.compile(r"^<!\[CDATA\[(.*)\]\]>$", re.DOTALL)
_M3 = re.escape(M3)
_M3_ELEMENT = re.compile(f"{_M3}<(?P<key>[^>/]+)>(?P<value>.*?){_M3}</(?P=key)>", re.DOTALL)


def _alternative(schema: Any, kind: str) -> Any:
    """The part of ``schema`` (or of one of its alternatives) for values of JSON type ``kind``."""
    if not isinstance(schema, dict) or schema.get("type") == kind:
        return schema
    return next((alt for key in ("anyOf", "oneOf") for alt in schema.get(key) or [] if kind in kinds(alt)), {})


def m3_value(text: str, schema: Any) -> Any:
    """A MiniMax M3 parameter's text as its value: objects and arrays are written as nested elements (an array's as
    ``<item>`` elements), read as such unless the schema wants a string; scalars as :func:`typed` reads them."""
    elements = list(_M3_ELEMENT.finditer(text))
    if "string" in kinds(schema) or not elements or "".join(m.group() for m in elements) != text.strip():
        return typed(text, schema)
    if all(m.group("key") == "item" for m in elements) and "object" not in kinds(schema):
        items = _alternative(schema, "array").get("items") if isinstance(schema, dict) else None
        return [m3_value(m.group("value"), items) for m in elements]
    props = (_alternative(schema, "object").get("properties") or {}) if isinstance(schema, dict) else {}
    return {m.group("key"): m3_value(m.group("value"), props.get(m.group("key"))) for m in elements}


_DSML = "｜DSML｜"
_XML_PARAM = r"\s*<parameter=(?P<key>[^>\n]+)>{}(?P<value>.*?){}</parameter>"
_K3 = r"<\|{}\|>{}<\|sep\|>"
SHAPES: dict[str, Shape] = {
    "json": _shape(r'\s|[\[,;\}]|</tool_call>|<\|python_tag\|>|\[TOOL_CALLS\]', r"(?:<tool_call>\s*)?" + _NAME),
    "granite": _shape(r"\s|[\[,\}]|<\|tool_call\|>", _NAME),
    "firefunction": _shape(r"\s|[\[,\}]|functools", _NAME),
    "functionary": _shape(r"\s|</function>", r"<function=(?P<name>[^>\s]+)>\s*(?=\{)"),
    "gigachat": _shape(r"\s|[\[,\}]|<\|function_call\|>|<\|message_sep\|>|function call<\|role_sep\|>", _NAME),
    "apriel": _shape(r"\s|[\[,\}]|</?tool_calls>", _NAME),
    "minimax-m1": _shape(r"\s|[\[,\}]|</?tool_calls>", _NAME),
    "toolcall": _shape(r"\s|[\[,\}]|</?TOOLCALL>", _NAME),
    "minicpm": _shape(r"\s", r'<function name="(?P<name>[^"]+)">',
                      r'\s*<param name="(?P<key>[^"]+)">(?P<value><!\[CDATA\[.*?\]\]>|(?!<!\[CDATA\[).*?)</param>',
                      r"\s*</function>", ("</param>", "</function>"),
                      lambda text, schema: typed(_CDATA.sub(r"\1", text), schema)),
    "apertus": _shape(r"\s|[\[,\}]|<\|tools_prefix\|>", r'\{\s*"(?P<name>[^"\\]+)"\s*:\s*(?=\{)'),
    "cohere-plus": _shape(r"\s|[\[,\}]|Action:|```(?:json)?",
                          r'\{\s*"tool_name"\s*:\s*"(?P<name>[^"\\]+)"\s*,\s*"parameters"\s*:\s*(?=\{)'),
    "cohere": _shape(r"\s|[\[,\}]|<\|START_ACTION\|>|<\|END_ACTION\|>",
                     r'\{\s*"tool_call_id"\s*:\s*"(?P<id>[^"\\]*)"\s*,\s*"tool_name"\s*:\s*"(?P<name>[^"\\]+)"\s*,'
                     r'\s*"parameters"\s*:\s*(?=\{)'),
    "mistral-args": _shape(r"\s", r"\[TOOL_CALLS\]\s*(?P<name>[^\[\s]+)\s*(?:\[CALL_ID\]\s*(?P<id>[^\[\s]+)\s*)?"
                                  r"\[ARGS\]\s*(?=\{)"),
    "xml": _shape(r"\s|</tool_call>", r"<tool_call>\s*<function=(?P<name>[^>\n]+)>", _XML_PARAM.format(r"\n?", r"\n?"),
                  r"\s*</function>", ("</parameter>", "</function>")),
    "seed": _shape(r"\s|</seed:tool_call>", r"<seed:tool_call>\s*<function=(?P<name>[^>\n]+)>",
                   _XML_PARAM.format("", ""), r"\s*</function>", ("</parameter>", "</function>")),
    "glm": _shape(r"\s|</tool_call>", r"<tool_call>\s*(?P<name>[^\s<]+)(?=[\s<])",
                  r"\s*<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>", r"\s*</tool_call>",
                  ("</arg_value>", "</tool_call>")),
    "minimax": _shape(r"\s|</?minimax:tool_call>", r'<invoke name="(?P<name>[^"]+)">',
                      r'\s*<parameter name="(?P<key>[^"]+)">(?P<value>.*?)</parameter>', r"\s*</invoke>",
                      ("</parameter>", "</invoke>")),
    "dsml": _shape(f"\\s|</?{_DSML}(?:function|tool)_calls>", f'<{_DSML}invoke name="(?P<name>[^"]+)">',
                   f'\\s*<{_DSML}parameter name="(?P<key>[^"]+)"[^>]*>(?P<value>.*?)</{_DSML}parameter>',
                   f"\\s*</{_DSML}invoke>", (f"</{_DSML}parameter>", f"</{_DSML}invoke>")),
    "kimi3": _shape("|".join([r"\s", _K3.format("open", "tools"), _K3.format("close", "tools"),
                              _K3.format("close", "message")]),
                    r'<\|open\|>call tool="(?P<name>[^"]+)"[^<]*<\|sep\|>',
                    r'<\|open\|>argument key="(?P<key>[^"]+)"[^<]*<\|sep\|>(?P<value>.*?)'
                    + _K3.format("close", "argument"),
                    _K3.format("close", "call"), ("<|close|>argument<|sep|>", "<|close|>call<|sep|>")),
    "gemma": _shape(r"\s", r"<\|tool_call>call:(?P<name>[^{\s]+)(?=\{)", "", r"(?P<args>\{.*?\})<tool_call\|>",
                    ("<tool_call|>",)),
    "minimax3": _shape(f"\\s|{_M3}</?tool_call>", f'{_M3}<invoke name="(?P<name>[^"]+)">',
                       f"{_M3}<(?P<key>[^>/]+)>(?P<value>.*?){_M3}</(?P=key)>", f"{_M3}</invoke>",
                       (f"{M3}</",), m3_value),
    "hy3": _shape(r"\s|</?tool_calls:opensource>",
                  r"<tool_call:opensource>\s*(?P<name>[^\s<]+)\s*<tool_sep:opensource>",
                  r"\s*<arg_key:opensource>(?P<key>.*?)</arg_key:opensource>\s*<arg_value:opensource>(?P<value>.*?)"
                  r"</arg_value:opensource>", r"\s*</tool_call:opensource>",
                  ("</arg_value:opensource>", "</tool_call:opensource>")),
    "solar": _shape(r"\s|<\|tool_calls\|>|<\|tool_call:end\|>|<\|end\|>",
                    r"<\|tool_call:begin\|>(?P<id>[^<\s]*)<\|tool_call:name\|>(?P<name>[^<\s]+)<\|tool_call:args\|>"
                    r"\s*(?=\{)"),
    "atem": _shape(r"\s|<\|eom\|>|<\|start\|>assistant|</atem:function_calls>",
                   r'to=[^<\s]+<\|message\|>\s*<atem:function_calls>\s*<atem:invoke name="(?P<name>[^"]+)">',
                   r'\s*<atem:parameter name="(?P<key>[^"]+)">(?P<value>.*?)</atem:parameter>', r"\s*</atem:invoke>",
                   ("</atem:parameter>", "</atem:invoke>")),
    "recipient": _shape(r"\s|>>>all\n", r">>>(?P<name>[^\s>]+)\s*(?=\{)"),
    "deepseek": _shape(f"\\s|<｜tool▁calls▁begin｜>|{_DS_END}",
                       r"<｜tool▁call▁begin｜>\s*(?P<name>[^\s<]+)\s*<｜tool▁sep｜>\s*(?=\{)"),
    "deepseek-r1": _shape(f"\\s|```|<｜tool▁calls▁begin｜>|{_DS_END}",
                          r"<｜tool▁call▁begin｜>\s*\w*\s*<｜tool▁sep｜>\s*(?P<name>[^\s`<]+)\s*```(?:json)?\s*(?=\{)"),
    "kimi": _shape(r"\s|<\|tool_calls_section_begin\|>|<\|tool_call_end\|>",
                   rf"<\|tool_call_begin\|>\s*{_KIMI_ID}\s*<\|tool_call_argument_begin\|>\s*(?=\{{)"),
    "harmony": _shape(r"\s|<\|call\|>|<\|end\|>",
                      r"(?:<\|start\|>assistant)?\s*(?:<\|channel\|>\w+\s*)?to=functions\.(?P<name>[^\s<]+)\s*"
                      r"(?:<\|channel\|>\w+\s*)?(?:<\|constrain\|>\s*\w+\s*)?<\|message\|>\s*(?=\{)"),
}
# the formats whose whole answers are read by the reader too (the others: api/call_formats.py)
WHOLE = frozenset({"functionary", "recipient", "solar", *(f for f, shape in SHAPES.items() if shape.close is not None)})
LOOKAHEAD = 400  # characters a header may take before the reader stops looking for it


@dataclass(frozen=True)
class CallPiece:
    """A piece of a streamed call: the first names it (and carries the model's id, if it wrote one)."""

    index: int
    arguments: str
    name: str | None = None
    id: str | None = None


@dataclass
class SentCall:
    name: str
    id: str | None
    arguments: str = ""
    done: bool = False  # its arguments are complete


@dataclass
class CallReader:
    fmt: str
    tools: Mapping[str, dict[str, Any]]
    sent: list[SentCall] = field(default_factory=list)
    at: int = 0  # where reading goes on in the section
    state: str = "header"  # header, args, params, stopped
    depth: int = 0  # the JSON arguments: nesting, and whether in a string (and after its backslash)
    quoted: bool = False
    escaped: bool = False
    members: int = 0  # params: how many were sent
    seen: int = 0  # params: how far the section was looked at for the tags that end one (so each is looked at once)
    call: SentCall | None = None  # the call being read: it goes out (is announced) with its arguments' first piece
    announced: bool = False

    def __post_init__(self) -> None:
        self.shape = SHAPES.get(self.fmt)
        if self.shape is None:
            self.state = "stopped"

    @property
    def stopped(self) -> bool:
        return self.state == "stopped"

    def read(self, section: str, end: bool = False) -> list[CallPiece]:
        """What of the calls can go out now, ``section`` being the calls section so far (``end``: all of it)."""
        pieces: list[CallPiece] = []
        while self.state != "stopped":
            before = (self.state, self.at)
            if self.state == "header":
                self._header(section, pieces)
            elif self.state == "args":
                self._args(section, pieces)
            else:
                self._params(section, pieces, end)
            if (self.state, self.at) == before:
                break
        return pieces

    def _header(self, section: str, pieces: list[CallPiece]) -> None:
        assert self.shape is not None
        m = self.shape.start.match(section, self.at)
        if m is None:
            if len(section) - self.at > LOOKAHEAD:
                self.state = "stopped"
            return
        name = m.group("name").strip()
        if name not in self.tools:
            self.state = "stopped"  # not a call of an offered function: read whole at the end
            return
        self.call, self.announced = SentCall(name, m.groupdict().get("id")), False
        self.at, self.state = m.end(), ("params" if self.shape.close is not None else "args")
        self.depth, self.quoted, self.escaped, self.members = 0, False, False, 0

    def _args(self, section: str, pieces: list[CallPiece]) -> None:
        start, end = self.at, len(section)
        for i in range(start, len(section)):
            c = section[i]
            if self.quoted:
                self.escaped, self.quoted = (False, True) if self.escaped else (c == "\\", c != '"')
                continue
            if c == '"':
                self.quoted = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    end = i + 1
                    break
            elif c == "<":
                end = i
                self.state = "stopped"  # markup inside the arguments: they are broken
                break
        self._send(section[start:end], pieces)
        self.at = end
        if self.depth == 0 and self.state == "args":
            assert self.call is not None
            self.call.done, self.state = True, "header"

    def _params(self, section: str, pieces: list[CallPiece], end: bool = False) -> None:
        assert self.shape is not None and self.shape.close is not None and self.call is not None
        new = max(self.at, self.seen - max(map(len, self.shape.ends)))
        if not end and not any(tag in section[new:] for tag in self.shape.ends):
            self.seen = len(section)
            return  # nothing can have been completed since the last look
        one = self.shape.param.match(section, self.at) if self.shape.param is not None else None
        if one is not None:
            schema = self.tools[self.call.name].get("properties") or {}
            key = one.group("key").strip()
            member = f"{json.dumps(key, ensure_ascii=False)}: " + json.dumps(
                (self.shape.value or typed)(one.group("value"), schema.get(key)), ensure_ascii=False)
            self._send(("{" if not self.members else ", ") + member, pieces)
            self.members += 1
            self.at = one.end()
            return
        close = self.shape.close.match(section, self.at)
        if close is None and not (end and self.shape.param is not None and not section[self.at:].strip()):
            self.seen = len(section)
            return  # (a whole answer may end without closing its last call)
        if close is not None and close.groupdict().get("args") is not None:  # the arguments, whole (Gemma)
            args = gemma_args(close.group("args"))
            if args is None:
                self.state = "stopped"
                return
            self._send(json.dumps(args, ensure_ascii=False), pieces)
        else:
            self._send("{}" if not self.members else "}", pieces)
        self.call.done = True
        self.at, self.state = (len(section) if close is None else close.end()), "header"

    def _send(self, text: str, pieces: list[CallPiece]) -> None:
        if not text:
            return
        assert self.call is not None
        if not self.announced:  # the call's first piece names it
            self.sent.append(self.call)
            self.announced = True
            pieces.append(CallPiece(len(self.sent) - 1, text, self.call.name, self.call.id))
        else:
            pieces.append(CallPiece(len(self.sent) - 1, text))
        self.call.arguments += text


def call_deltas(pieces: list[CallPiece]) -> list[ToolCallDelta] | None:
    """A stream's ``tool_calls`` delta: the calls' pieces, numbered in the answer's order; a call's first piece
    carries its id (the model's, or a new one) and name."""
    return [ToolCallDelta(index=p.index, function=FunctionDelta(name=p.name, arguments=p.arguments))
            if p.name is None else
            ToolCallDelta(index=p.index, id=p.id or call_id(), type="function",
                          function=FunctionDelta(name=p.name, arguments=p.arguments))
            for p in pieces] or None


def read_whole(fmt: str, section: str, tools: Mapping[str, dict[str, Any]]) -> tuple[list[ParsedCall], str] | None:
    """The calls of a whole calls section in a format the reader follows to its end (:data:`WHOLE`), and the text
    after them; None unless the section is calls, each of an offered function, with text only after the last."""
    reader = CallReader(fmt, tools)
    reader.read(section, end=True)
    if reader.state != "header" or not reader.sent:
        return None
    gap = reader.shape.gap.match(section, reader.at) if reader.shape is not None else None
    rest = section[reader.at if gap is None else gap.end():]
    if reader.shape is not None and reader.shape.start.match(rest):
        return None  # a call the reader stopped at (cut, or malformed)
    return [ParsedCall(c.name, c.arguments, c.id) for c in reader.sent], rest.strip()


_GEMMA_TOKEN = re.compile(r'<\|"\|>(?P<text>.*?)<\|"\|>|(?P<json>"(?:\\.|[^"\\])*")|(?P<mark>[{}\[\],:])|'
                          r"(?P<word>[^{}\[\],:<\s\"]+)|(?P<blank>\s+)", re.DOTALL)


def gemma_args(text: str) -> dict[str, Any] | None:
    """Gemma 4's arguments (``{city:<|"|>Paris<|"|>,n:3}``: bare keys, strings between ``<|"|>`` marks) as an
    object; None if they are not one."""
    out, at = [], 0
    for m in _GEMMA_TOKEN.finditer(text):
        if m.start() != at:
            return None
        at = m.end()
        if m.group("text") is not None:
            out.append(json.dumps(m.group("text"), ensure_ascii=False))
        elif m.group("word") is not None:
            word = m.group("word")
            literal = text[at:].lstrip()[:1] != ":" and re.fullmatch(r"-?[\d.eE+-]+|true|false|null", word)
            out.append(word if literal else json.dumps(word))
        else:
            out.append(m.group("json") or m.group("mark") or " ")
    try:
        value = json.loads(re.sub(r"([{\[])\s*,|,\s*([}\]])", r"\1\2", "".join(out))) if at == len(text) else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
