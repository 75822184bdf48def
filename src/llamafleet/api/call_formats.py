"""Each family's tool calls, read out of the part of an answer that holds them (its *calls section*: from the first
marker that opens a call to the end; :mod:`~llamafleet.api.answer` finds it).

The formats (:attr:`~llamafleet.engine.families.Family.calls`):

* ``json``: ``<tool_call>{"name", "arguments"}</tool_call>`` blocks (Hermes, Qwen 2.5/3, Granite 4), or an answer
  that is JSON calls only (Llama 3.x ``{"name", "parameters"}`` after an optional ``<|python_tag|>``, generic
  JSON): :func:`~llamafleet.api.tool_calls.parse`;
* ``mistral`` / ``mistral-args``: ``[TOOL_CALLS]`` then a JSON list of calls (Nemo, ids in the calls), or
  ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`` repeated (Small 3.2, Devstral, Magistral, Ministral 3);
* the formats that write one parameter at a time, read by :func:`~llamafleet.api.call_stream.read_whole` with the
  shapes a stream is read with (values are text, read as JSON where the tool's schema wants no string): ``xml``
  ``<tool_call><function=name><parameter=key>value</parameter></function></tool_call>`` (Qwen3-Coder, Qwen 3.5),
  ``seed`` the same in ``<seed:tool_call>`` (Seed-OSS), ``glm`` ``<tool_call>name<arg_key>key</arg_key>
  <arg_value>value</arg_value></tool_call>`` (GLM 4.5+; ``hy3`` the same tags with ``:opensource`` and
  ``<tool_sep:opensource>`` after the name, in a ``<tool_calls:opensource>`` section: Hunyuan 3),
  ``minimax`` ``<minimax:tool_call><invoke name="name">
  <parameter name="key">value</parameter></invoke>`` (MiniMax M2), ``dsml`` the same with ``｜DSML｜`` tags
  (DeepSeek V3.2), ``kimi3`` ``<|open|>call tool="name"<|sep|><|open|>argument key="key"<|sep|>value
  <|close|>argument<|sep|><|close|>call<|sep|>`` (Kimi K3), ``minimax3`` ``]<]minimax[>[<invoke name="name">
  ]<]minimax[>[<key>value]<]minimax[>[</key>]<]minimax[>[</invoke>`` in a ``]<]minimax[>[<tool_call>`` section
  (MiniMax M3: objects and arrays as nested elements, an array's as ``<item>``), and ``gemma``
  ``<|tool_call>call:name{key:value}<tool_call|>`` (Gemma 4: bare keys, strings between ``<|"|>`` marks);
* ``cohere``: ``<|START_ACTION|>`` then a JSON list of ``{"tool_call_id", "tool_name", "parameters"}``
  (Command R7B); ``cohere-plus``: ``Action:`` and the list, without ids, in a fenced JSON block (Command R+);
* ``gigachat``: a ``{"name", "arguments"}`` object after ``<|function_call|>`` (GigaChat 3.1) or the
  ``function call`` role (GigaChat 3); ``apertus``: ``<|tools_prefix|>[{"name": {...}}]<|tools_suffix|>``;
  ``apriel``: ``<tool_calls>[{"name", "arguments"}, ...]</tool_calls>`` (Apriel 1.6), ``minimax-m1`` the same
  objects a line each (MiniMax M1), ``toolcall`` the list in ``<TOOLCALL>`` (Nemotron Nano v2);
* ``minicpm``: ``<function name="name"><param name="key">value</param></function>``, a value in CDATA where it
  holds markup (MiniCPM 5);
* ``deepseek``: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>`` with
  ``function<｜tool▁sep｜>name`` and a fenced JSON block (R1) or ``name<｜tool▁sep｜>{...}`` (V3.1);
* ``kimi``: ``<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}<|tool_call_end|>`` in a
  section; the ``functions.name:0`` is the call's id;
* ``granite``: ``<|tool_call|>`` then a JSON list (Granite 3.x); ``firefunction``: `` functools`` then a JSON list
  (FireFunction v2); ``functionary``: ``<function=name>{...}</function>`` (Functionary v3.1, read by the reader);
* ``atem``: ``to=name<|message|><atem:function_calls><atem:invoke name="name"><atem:parameter name="key">value
  </atem:parameter></atem:invoke></atem:function_calls>``, a message to the function (Muse Glimmer; its messages
  part by ``<|eom|><|start|>assistant``);
* ``solar``: ``<|tool_calls|>`` then ``<|tool_call:begin|>id<|tool_call:name|>name<|tool_call:args|>{...}
  <|tool_call:end|>`` for each call (Solar Open; read by the reader);
* ``recipient``: ``>>>name\n{...}`` for each call, ``>>>all\n`` before text (Functionary v3.2, whose prompt ends
  with the first ``>>>``; read by the reader);
* ``pythonic``: ``<|tool_call_start|>[name(key=value, ...), ...]<|tool_call_end|>`` (LFM2): Python's syntax, parsed
  (never run) and only literals read, ``true``/``false``/``null`` as well as Python's names;
* ``harmony`` (gpt-oss): ``<|channel|>commentary to=functions.name <|constrain|>json<|message|>{...}<|call|>``, the
  recipient in the channel or in the role header (``<|start|>assistant to=functions.name<|channel|>...``).

Every call must name an offered function and carry a JSON object of arguments; a section that holds anything else
is not calls (None), and the caller keeps it as text. Pure logic.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from llamafleet.api.call_stream import WHOLE, read_whole
from llamafleet.api.tool_calls import ParsedCall, json_values, parse

Schemas = Mapping[str, dict[str, Any]]  # function name -> its parameters schema
Found = tuple[list[ParsedCall], str]  # the calls, and the text of the section that is not part of them


def _object(args: Any) -> str | None:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return json.dumps(args, ensure_ascii=False) if isinstance(args, dict) else None


def _call(name: str, args: Any, tools: Schemas, call_id: str | None = None) -> ParsedCall | None:
    text = _object(args) if name in tools else None
    return None if text is None else ParsedCall(name, text, call_id)


def _all(calls: list[ParsedCall | None], rest: str = "") -> Found | None:
    found = [c for c in calls if c is not None]
    return (found, rest) if found and len(found) == len(calls) else None


def _json(section: str, tools: Schemas) -> Found | None:
    content, calls = parse(section, tools)
    return (calls, content or "") if calls else None


def _mistral(section: str, tools: Schemas) -> Found | None:
    values = json_values(section.replace("[TOOL_CALLS]", " "))
    if not values:
        return None
    items = [i for v in values for i in (v if isinstance(v, list) else [v])]
    return _all([_call(i["name"], i.get("arguments"), tools, i.get("id")) if isinstance(i, dict) and
                 isinstance(i.get("name"), str) else None for i in items])


_ARGS_CALL = re.compile(r"\[TOOL_CALLS\]\s*([^\[\s]+)\s*(?:\[CALL_ID\]\s*([^\[\s]+)\s*)?\[ARGS\]")


def _mistral_args(section: str, tools: Schemas) -> Found | None:
    decoder, at, calls = json.JSONDecoder(), 0, []
    while at < len(section.rstrip()):
        m = _ARGS_CALL.match(section, at)
        if m is None:
            return None
        try:
            args, at = decoder.raw_decode(section, m.end())
        except ValueError:
            return None
        calls.append(_call(m.group(1), args, tools, m.group(2)))
        at += len(section[at:]) - len(section[at:].lstrip())
    return _all(calls)


def _blocks(pattern: re.Pattern[str], section: str, read: Callable[[re.Match[str]], ParsedCall | None]) -> Found | None:
    """Calls that are blocks matching ``pattern``, blanks between them; text after the last one is the rest."""
    calls, at = [], 0
    for m in pattern.finditer(section):
        if section[at:m.start()].strip():
            return None
        calls.append(read(m))
        at = m.end()
    return _all(calls, section[at:].strip())


_DS_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁call▁end｜>", re.DOTALL)
_DS_FENCED = re.compile(r"^\s*(\S+?)\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def _deepseek_call(body: str, tools: Schemas) -> ParsedCall | None:
    head, sep, tail = body.partition("<｜tool▁sep｜>")
    if not sep:
        return None
    fenced = _DS_FENCED.match(tail)
    if fenced:  # R1: function<｜tool▁sep｜>name\n```json\n{...}\n```
        return _call(fenced.group(1), fenced.group(2), tools)
    return _call(head.strip(), tail.strip(), tools)  # V3.1: name<｜tool▁sep｜>{...}


def _deepseek(section: str, tools: Schemas) -> Found | None:
    body = section.removeprefix("<｜tool▁calls▁begin｜>")
    body, _, rest = body.partition("<｜tool▁calls▁end｜>")
    found = _blocks(_DS_CALL, body, lambda m: _deepseek_call(m.group(1), tools))
    return None if found is None else (found[0], rest.strip())


_KIMI_CALL = re.compile(r"<\|tool_call_begin\|>\s*(\S+?)\s*<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>",
                        re.DOTALL)


def _kimi_call(m: re.Match[str], tools: Schemas) -> ParsedCall | None:
    call_id = m.group(1)
    name = call_id.split(".", 1)[-1].rsplit(":", 1)[0]  # functions.get_weather:0
    return _call(name, m.group(2).strip(), tools, call_id)


def _kimi(section: str, tools: Schemas) -> Found | None:
    body = section.removeprefix("<|tool_calls_section_begin|>")
    body, _, rest = body.partition("<|tool_calls_section_end|>")
    found = _blocks(_KIMI_CALL, body, lambda m: _kimi_call(m, tools))
    return None if found is None else (found[0], rest.strip())


_HARMONY_CALL = re.compile(
    r"(?:<\|start\|>assistant)?\s*(?:<\|channel\|>\w+\s*)?to=functions\.([^\s<]+)\s*(?:<\|channel\|>\w+\s*)?"
    r"(?:<\|constrain\|>\s*\w+\s*)?<\|message\|>(.*?)(?:<\|call\|>|(?=<\|start\|>)|\Z)", re.DOTALL)


def _harmony(section: str, tools: Schemas) -> Found | None:
    return _blocks(_HARMONY_CALL, section, lambda m: _call(m.group(1), m.group(2).strip(), tools))


def _after(*marks: str) -> Callable[[str, Schemas], Found | None]:
    """The reader of ``{"name", "arguments"}`` objects (or lists of them) after any of ``marks``."""
    def read(section: str, tools: Schemas) -> Found | None:
        for mark in marks:
            section = section.replace(mark, " ")
        return _mistral(section, tools)
    return read


def _apertus(section: str, tools: Schemas) -> Found | None:
    body, _, rest = section.removeprefix("<|tools_prefix|>").partition("<|tools_suffix|>")
    values = json_values(body)
    items = [i for v in values or [] for i in (v if isinstance(v, list) else [v])]
    found = _all([_call(*next(iter(i.items())), tools) if isinstance(i, dict) and len(i) == 1 else None
                  for i in items])
    return None if found is None else (found[0], rest.strip())


class _Literals(ast.NodeTransformer):
    """JSON's and Python's names for true, false and null as constants (a model may write either)."""

    NAMES: ClassVar[dict[str, Any]] = {"true": True, "false": False, "null": None, "True": True, "False": False,
                                       "None": None}

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Constant(self.NAMES[node.id]) if node.id in self.NAMES else node


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else None


def _python_call(node: ast.expr, tools: Schemas) -> ParsedCall | None:
    name = _dotted(node.func) if isinstance(node, ast.Call) and not node.args else None
    if name is None or not isinstance(node, ast.Call) or any(k.arg is None for k in node.keywords):
        return None
    try:
        args = {k.arg: ast.literal_eval(_Literals().visit(k.value)) for k in node.keywords}
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None
    return _call(name, args, tools)


def _pythonic(section: str, tools: Schemas) -> Found | None:
    body, _, rest = section.removeprefix("<|tool_call_start|>").partition("<|tool_call_end|>")
    try:  # parsed, never run: only literals are read out of it
        tree = ast.parse(body.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    found = _all([_python_call(n, tools) for n in (tree.elts if isinstance(tree, ast.List) else [tree])])
    return None if found is None else (found[0], rest.strip())


def _cohere(section: str, tools: Schemas) -> Found | None:
    body, _, rest = section.removeprefix("<|START_ACTION|>").partition("<|END_ACTION|>")
    return _cohere_list(body, rest, tools)


def _cohere_plus(section: str, tools: Schemas) -> Found | None:
    """Command R+: ``Action:`` then a fenced JSON list of ``{"tool_name", "parameters"}``."""
    body = section.removeprefix("Action:").strip().removeprefix("```json").removeprefix("```")
    body, _, rest = body.partition("```")
    return _cohere_list(body, rest, tools)


def _cohere_list(body: str, rest: str, tools: Schemas) -> Found | None:
    values = json_values(body)
    items = [i for v in values or [] for i in (v if isinstance(v, list) else [v])]
    found = _all([_call(i["tool_name"], i.get("parameters"), tools, str(i.get("tool_call_id", "")) or None)
                  if isinstance(i, dict) and isinstance(i.get("tool_name"), str) else None for i in items])
    return None if found is None else (found[0], rest.strip())


FORMATS: dict[str, Callable[[str, Schemas], Found | None]] = {
    "json": _json, "mistral": _mistral, "mistral-args": _mistral_args, "deepseek": _deepseek,
    "deepseek-r1": _deepseek, "kimi": _kimi, "granite": _after("<|tool_call|>"), "harmony": _harmony,
    "cohere": _cohere, "cohere-plus": _cohere_plus, "firefunction": _after("functools"), "pythonic": _pythonic,
    "gigachat": _after("<|function_call|>", "<|message_sep|>", "function call<|role_sep|>"), "apertus": _apertus,
    "apriel": _after("<tool_calls>", "</tool_calls>"), "minimax-m1": _after("<tool_calls>", "</tool_calls>"),
    "toolcall": _after("<TOOLCALL>", "</TOOLCALL>"),
}


def read_calls(fmt: str, section: str, tools: Schemas) -> Found | None:
    """The calls in ``section`` written in format ``fmt`` and the text left beside them; None if it holds no calls
    or anything malformed (then it is text)."""
    return read_whole(fmt, section, tools) if fmt in WHOLE else FORMATS[fmt](section, tools)
