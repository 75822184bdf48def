"""Forced tool calls in a model family's own call format (:func:`format_calls`).

A forced call (``tool_choice`` ``"required"`` or a named function) samples under a GBNF grammar whose every sentence
is one call (``many``: one to :data:`~llamafleet.api.tools.MAX_PARALLEL_CALLS`) of an offered function, written as
the model writes calls (:mod:`~llamafleet.api.call_formats` reads them back), its arguments valid under the
function's schema where the format carries them as JSON (:func:`~llamafleet.engine.grammar.json_schema_grammar`); the
XML-like formats (``xml``, ``glm``) carry each argument as text, constrained to the function's parameter names. The
sentence ends after the last call, so the model stops there (end of generation) instead of writing on.

A family that thinks may write its think block first: :func:`~llamafleet.engine.grammar.after_thinking` puts an
optional one before any grammar's sentences, so a forced call or a JSON schema never stops the model from reasoning.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llamafleet.api.errors import ApiError
from llamafleet.engine.families import M3, Family
from llamafleet.engine.grammar import json_schema_grammar

_ROOT = re.compile(r"^root ::= ", re.MULTILINE)
_WORDS = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*|[A-Za-z][A-Za-z0-9-]*')
TEXT_VALUE = 'text-value ::= ([^<] | "<" [^/])*'  # an argument written as text: anything up to its closing tag
TAG_TEXT = 'tag-text ::= ([^<] | "<" [^|])*'  # ... up to a tag that opens with <| (Kimi K3, Gemma 4's strings)
PY_TEXT = r'py-text ::= "\"" ([^"\\\n] | "\\" [^\n])* "\""'  # ... as a quoted string (LFM2's Python-like calls)
TEXTS = {"text-value": TEXT_VALUE, "tag-text": TAG_TEXT, "py-text": PY_TEXT}
_DS = "｜DSML｜"
# the formats that write one argument at a time: how a call opens and closes (``{n}``: the function's name, ``{a}``:
# its arguments' rule), how one argument is written (``{key}``, ``{value}``, ``{text}``: whether it is text), and
# what writes an argument's text
PARAMS: dict[str, tuple[str, str, str]] = {
    "xml": ('"<tool_call>\\n<function=" {n} ">\\n" {a} "</function>\\n</tool_call>"',
            '"<parameter=" {key} ">\\n" {value} "\\n</parameter>\\n"', "text-value"),
    "seed": ('"<seed:tool_call>\\n<function=" {n} ">\\n" {a} "</function>\\n</seed:tool_call>"',
             '"<parameter=" {key} ">" {value} "</parameter>\\n"', "text-value"),
    "glm": ('"<tool_call>" {n} "\\n" {a} "</tool_call>"',
            '"<arg_key>" {key} "</arg_key>\\n<arg_value>" {value} "</arg_value>\\n"', "text-value"),
    "minimax": ('"<invoke name=\\"" {n} "\\">\\n" {a} "</invoke>"',
                '"<parameter name=\\"" {key} "\\">" {value} "</parameter>\\n"', "text-value"),
    "dsml": (f'"<{_DS}invoke name=\\"" {{n}} "\\">\\n" {{a}} "</{_DS}invoke>"',
             f'"<{_DS}parameter name=\\"" {{key}} "\\" string=\\"" {{text}} "\\">" {{value}} "</{_DS}parameter>\\n"',
             "text-value"),
    "kimi3": ('"<|open|>call tool=\\"" {n} "\\" index=\\"" [1-9] "\\"<|sep|>" {a} "<|close|>call<|sep|>"',
              '"<|open|>argument key=\\"" {key} "\\"<|sep|>" {value} "<|close|>argument<|sep|>"', "tag-text"),
    "gemma": ('"<|tool_call>call:" {n} "{{" {a} "}}<tool_call|>"', '{key} ":" {value}',
              '"<|\\"|>" tag-text "<|\\"|>"'),
    "pythonic": ('{n} "(" {a} ")"', '{key} "=" {value}', "py-text"),
    "hy3": ('"<tool_call:opensource>" {n} "<tool_sep:opensource>\\n" {a} "</tool_call:opensource>\\n"',
            '"<arg_key:opensource>" {key} "</arg_key:opensource>\\n<arg_value:opensource>" {value} '
            '"</arg_value:opensource>\\n"', "text-value"),
    "atem": ('" to=" {n} "<|message|><atem:function_calls>\\n<atem:invoke name=\\"" {n} "\\">\\n" {a} '
             '"</atem:invoke>\\n</atem:function_calls>"',
             '"<atem:parameter name=\\"" {key} "\\">" {value} "</atem:parameter>\\n"', "text-value"),
    "minicpm": ('"<function name=\\"" {n} "\\">" {a} "</function>"',
                '"<param name=\\"" {key} "\\">" {value} "</param>"', "text-value"),
    "minimax3": (f'"{M3}<invoke name=\\"" {{n}} "\\">" {{a}} "{M3}</invoke>\\n"',
                 f'"{M3}<" {{key}} ">" {{value}} "{M3}</" {{key}} ">"', "text-value"),
}
SEPARATED = {"gemma": '","', "pythonic": '", "'}  # what goes between two arguments, where the format has it
SECTIONS = {  # what opens and closes the calls
    "deepseek": ('"<｜tool▁calls▁begin｜>"', '"<｜tool▁calls▁end｜>"'),
    "deepseek-r1": ('"<｜tool▁calls▁begin｜>"', '"<｜tool▁calls▁end｜>"'),
    "kimi": ('"<|tool_calls_section_begin|>"', '"<|tool_calls_section_end|>"'),
    "minimax": ('"<minimax:tool_call>\\n"', '"\\n</minimax:tool_call>"'),
    "kimi3": ('"<|open|>tools<|sep|>"', '"<|close|>tools<|sep|>"'),
    "pythonic": ('"<|tool_call_start|>["', '"]<|tool_call_end|>"'),
    "minimax3": (f'"{M3}<tool_call>\\n"', f'"{M3}</tool_call>"'),
    "hy3": ('"<tool_calls:opensource>\\n"', '"</tool_calls:opensource>"'),
    "solar": ('"<|tool_calls|>"', ""),
}


LISTED = {  # the formats that write a JSON list of calls: what opens and closes it
    "cohere": ('"<|START_ACTION|>["', '"]<|END_ACTION|>"'),
    "cohere-plus": ('"Action:\\n```json\\n["', '"]\\n```"'),
    "apertus": ('"<|tools_prefix|>["', '"]<|tools_suffix|>"'),
}


NAMED = {  # the formats that write {"name", "arguments"} objects in a section: what opens it, goes between, closes it
    "mistral": ('"[TOOL_CALLS]["', '", "', '"]"'),
    "granite": ('"<|tool_call|>["', '", "', '"]"'),
    "firefunction": ('" functools["', '", "', '"]"'),
    "apriel": ('"<tool_calls>["', '", "', '"]</tool_calls>"'),
    "minimax-m1": ('"<tool_calls>\\n"', '"\\n"', '"\\n</tool_calls>"'),
    "toolcall": ('"<TOOLCALL>["', '", "', '"]</TOOLCALL>"'),
}


def literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    return json.dumps(text, ensure_ascii=False)


def renamed(gbnf: str, prefix: str) -> str:
    """``gbnf`` with every rule name prefixed, so several grammars can live in one."""
    return _WORDS.sub(lambda m: prefix + m.group() if m.group()[0].isalpha() else m.group(), gbnf)


def _schema(schema: Any, prefix: str) -> str:
    try:
        return renamed(json_schema_grammar(schema), prefix)
    except ValueError as e:
        raise ApiError(400, f"invalid 'tools' parameters schema for a forced call: {e}", param="tools") from None


def _json_calls(tools: list[tuple[str, dict[str, Any]]], key: str) -> str:
    """Rules ``c-root``: one ``{"name": ..., key: {...}}`` object of any of ``tools``."""
    schema = {"anyOf": [{"type": "object", "properties": {"name": {"const": name}, key: args},
                         "required": ["name", key], "additionalProperties": False} for name, args in tools]}
    return _schema(schema, "c-")


def _text_args(index: int, args: dict[str, Any], one: str, text: str, sep: str = "") -> str:
    """Rules ``a<index>``: the named parameters of a function, each written by ``one`` (a GBNF expression with
    ``{key}``, ``{value}`` and ``{text}`` in it), the required ones present, in the schema's order (with ``sep``:
    the required ones first, ``sep`` between them); a value is ``text`` where the schema wants a string (or says
    nothing), JSON valid under its schema otherwise."""
    props = args.get("properties") or {}
    required = set(args.get("required") or [])
    items = sorted(props.items(), key=lambda kv: kv[0] not in required) if sep else list(props.items())
    parts, rules = [], []
    for j, (key, schema) in enumerate(items):
        kind = schema.get("type") if isinstance(schema, dict) else None
        value, is_text = text, True
        if kind not in (None, "string") and not (isinstance(kind, list) and "string" in kind):
            value, is_text = f"a{index}-{j}-root", False
            rules.append(_schema(schema, f"a{index}-{j}-"))
        item = one.format(key=literal(key), value=value, text=literal(str(is_text).lower()))
        parts.append(f"({sep + ' ' if sep and j else ''}{item}){'' if key in required else '?'}")
    return "\n".join([f"a{index} ::= " + (" ".join(parts) or '""'), *rules])


def _call_rules(family: Family, tools: list[tuple[str, dict[str, Any]]]) -> tuple[str, str, str, str]:
    """(the rules defining ``call``, what opens the calls, what goes between two calls, what closes them)."""
    fmt = family.calls
    if fmt in LISTED:  # a JSON list of objects whose properties are these, in order
        def props(name: str, args: dict[str, Any]) -> dict[str, Any]:
            shapes: dict[str, dict[str, Any]] = {
                "cohere": {"tool_call_id": {"enum": [str(i) for i in range(10)]}, "tool_name": {"const": name},
                           "parameters": args},
                "cohere-plus": {"tool_name": {"const": name}, "parameters": args}}
            return shapes.get(fmt, {name: args})
        schema = {"anyOf": [{"type": "object", "properties": props(name, args), "required": list(props(name, args)),
                             "additionalProperties": False} for name, args in tools]}
        opener, closer = LISTED[fmt]
        return f"call ::= c-root\n{_schema(schema, 'c-')}", opener, '", "', closer
    if fmt in ("json", "gigachat", *NAMED):
        key = "parameters" if family.name == "llama3" else "arguments"
        rules = _json_calls(tools, key)
        if family.name == "llama3":
            return f"call ::= c-root\n{rules}", "", '"; "', ""
        if fmt == "json":
            return f'call ::= "<tool_call>\\n" c-root "\\n</tool_call>"\n{rules}', "", '"\\n"', ""
        if fmt == "gigachat":  # its marker before each call
            return f"call ::= {literal(family.openers[0])} c-root\n{rules}", "", "", ""
        return f"call ::= c-root\n{rules}", *NAMED[fmt]
    alternatives: list[str] = []
    parts: list[str] = []
    for i, (name, args) in enumerate(tools):
        n = literal(name)
        if fmt in PARAMS:
            call, one, text = PARAMS[fmt]
            parts.append(_text_args(i, args, one, text, SEPARATED.get(fmt, "")))
            alternatives.append(call.format(n=n, a=f"a{i}"))
            continue
        parts.append(_schema(args, f"a{i}-"))
        alternatives.append({
            "mistral-args": f'"[TOOL_CALLS]" {n} "[ARGS]" a{i}-root',
            "deepseek": f'"<｜tool▁call▁begin｜>" {n} "<｜tool▁sep｜>" a{i}-root "<｜tool▁call▁end｜>"',
            "deepseek-r1": f'"<｜tool▁call▁begin｜>function<｜tool▁sep｜>" {n} "\\n```json\\n" a{i}-root '
                           '"\\n```<｜tool▁call▁end｜>"',
            "kimi": f'"<|tool_call_begin|>functions." {n} ":" [0-9] "<|tool_call_argument_begin|>" a{i}-root '
                    '"<|tool_call_end|>"',
            "harmony": f'"<|start|>assistant"? "<|channel|>commentary to=functions." {n} '
                       f'" <|constrain|>json<|message|>" a{i}-root "<|call|>"',
            "functionary": f'"<function=" {n} ">" a{i}-root "</function>"',
            "recipient": f'{n} "\\n" a{i}-root',  # (after the ">>>" the prompt ends with)
            "solar": f'"<|tool_call:begin|>" [a-zA-Z0-9]{{9}} "<|tool_call:name|>" {n} "<|tool_call:args|>" a{i}-root '
                     '"<|tool_call:end|>"',
        }[fmt])
    if fmt in PARAMS:
        parts += [rule for name, rule in TEXTS.items() if name in PARAMS[fmt][2]]
    body = f"call ::= {' | '.join(alternatives)}\n" + "\n".join(parts)
    opener, closer = SECTIONS.get(fmt, ("", ""))
    if fmt == "dsml":  # DeepSeek V3.2's function_calls, V4's tool_calls
        opener, closer = literal(family.openers[0] + "\n"), literal("\n" + family.openers[0].replace("<", "</", 1))
    between = {"xml": '"\\n"', "glm": '"\\n"', "seed": '"\\n"', "minimax": '"\\n"', "dsml": '"\\n"',
               "pythonic": '", "', "recipient": '">>>"',
               "atem": '"<|eom|><|start|>assistant"'}
    return body, opener, between.get(fmt, ""), closer


def format_calls(family: Family, tools: list[tuple[str, dict[str, Any]]], most: int) -> str:
    """GBNF for one to ``most`` calls of ``tools`` (name, parameters schema) in ``family``'s call format."""
    rules, opener, between, closer = _call_rules(family, tools)
    more = f" ({between} call){{0,{most - 1}}}".replace("( ", "(") if most > 1 else ""
    return f"root ::= {' '.join(p for p in (opener, 'call' + more, closer) if p)}\n{rules}\n"
