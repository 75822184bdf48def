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
from llamafleet.engine.families import Family
from llamafleet.engine.grammar import json_schema_grammar

_ROOT = re.compile(r"^root ::= ", re.MULTILINE)
_WORDS = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*|[A-Za-z][A-Za-z0-9-]*')
TEXT_VALUE = 'text-value ::= ([^<] | "<" [^/])*'  # an argument written as text: anything up to its closing tag


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


def _text_args(index: int, args: dict[str, Any], one: str) -> str:
    """Rules ``a<index>``: the named parameters of a function, each written by ``one`` (a GBNF expression with
    ``{key}`` and ``{value}`` in it), the required ones present, in the schema's order; a value is text where the
    schema wants a string (or says nothing), JSON valid under its schema otherwise."""
    props = args.get("properties") or {}
    required = set(args.get("required") or [])
    parts, rules = [], []
    for j, (key, schema) in enumerate(props.items()):
        kind = schema.get("type") if isinstance(schema, dict) else None
        value = "text-value"
        if kind not in (None, "string") and not (isinstance(kind, list) and "string" in kind):
            value = f"a{index}-{j}-root"
            rules.append(_schema(schema, f"a{index}-{j}-"))
        parts.append(f"({one.format(key=literal(key), value=value)}){'' if key in required else '?'}")
    return "\n".join([f"a{index} ::= " + (" ".join(parts) or '""'), *rules])


def _call_rules(family: Family, tools: list[tuple[str, dict[str, Any]]]) -> tuple[str, str, str, str]:
    """(the rules defining ``call``, what opens the calls, what goes between two calls, what closes them)."""
    fmt = family.calls
    if fmt in ("json", "mistral", "granite"):
        key = "parameters" if family.name == "llama3" else "arguments"
        rules = _json_calls(tools, key)
        call = {"json": 'call ::= "<tool_call>\\n" c-root "\\n</tool_call>"'}.get(fmt, "call ::= c-root")
        if family.name == "llama3":
            return f"call ::= c-root\n{rules}", "", '"; "', ""
        if fmt == "json":
            return f"{call}\n{rules}", "", '"\\n"', ""
        opener = '"[TOOL_CALLS]["' if fmt == "mistral" else '"<|tool_call|>["'
        return f"{call}\n{rules}", opener, '", "', '"]"'
    alternatives: list[str] = []
    parts: list[str] = []
    for i, (name, args) in enumerate(tools):
        n = literal(name)
        if fmt in ("xml", "glm"):
            one = ('"<parameter=" {key} ">\\n" {value} "\\n</parameter>\\n"' if fmt == "xml" else
                   '"<arg_key>" {key} "</arg_key>\\n<arg_value>" {value} "</arg_value>\\n"')
            parts.append(_text_args(i, args, one))
            alternatives.append(f'"<tool_call>\\n<function=" {n} ">\\n" a{i} "</function>\\n</tool_call>"'
                                if fmt == "xml" else f'"<tool_call>" {n} "\\n" a{i} "</tool_call>"')
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
        }[fmt])
    if fmt in ("xml", "glm"):
        parts.append(TEXT_VALUE)
    body = f"call ::= {' | '.join(alternatives)}\n" + "\n".join(parts)
    sections = {"deepseek": ('"<｜tool▁calls▁begin｜>"', '"<｜tool▁calls▁end｜>"'),
                "deepseek-r1": ('"<｜tool▁calls▁begin｜>"', '"<｜tool▁calls▁end｜>"'),
                "kimi": ('"<|tool_calls_section_begin|>"', '"<|tool_calls_section_end|>"')}
    opener, closer = sections.get(fmt, ("", ""))
    return body, opener, '"\\n"' if fmt in ("xml", "glm") else "", closer


def format_calls(family: Family, tools: list[tuple[str, dict[str, Any]]], most: int) -> str:
    """GBNF for one to ``most`` calls of ``tools`` (name, parameters schema) in ``family``'s call format."""
    rules, opener, between, closer = _call_rules(family, tools)
    more = f" ({between} call){{0,{most - 1}}}".replace("( ", "(") if most > 1 else ""
    return f"root ::= {' '.join(p for p in (opener, 'call' + more, closer) if p)}\n{rules}\n"
