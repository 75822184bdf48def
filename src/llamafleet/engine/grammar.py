"""Grammars for constrained sampling: JSON schema -> GBNF, and the limits that keep a client's grammar harmless.

Structured output is sampled under a GBNF grammar (llama.cpp's grammar sampler,
:class:`~llamafleet.engine.llama_sampler.SamplerChain`), so the answer always parses. JSON schemas become GBNF through
llama-cpp-python's port of llama.cpp's converter (``llama_cpp.llama_grammar``). That converter silently skips keywords
it cannot express (``minimum``, ``uniqueItems``, ...), which would let an answer parse yet fail validation; so the
schema is walked first and any keyword outside :data:`KEYWORDS` is refused, named with where it is. The converter
spells ``maxLength: n`` as ``n`` nested groups and ``minLength: n`` as ``n`` copies, so length and count bounds are
capped at :data:`MAX_REPEAT`.

llama.cpp parses and walks a grammar recursively: nesting 20,000 groups deep crashed a worker (stack overflow) where
10,000 did not, so :func:`check_gbnf` refuses grammars nested deeper than :data:`MAX_DEPTH` or longer than
:data:`MAX_GRAMMAR_BYTES`. Everything here is plain Python and loads no native library (see :func:`_converter`), so the
API process converts a request's schema, and refuses it with a 400, before anything is queued.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

MAX_GRAMMAR_BYTES = 128 * 1024
MAX_DEPTH = 2000  # nested groups in GBNF text; llama.cpp crashed at 20,000
MAX_REPEAT = 1000  # minLength, maxLength, minItems, maxItems and {m,n} in patterns
TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")
FORMATS = ("date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5")
KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
    "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "pattern", "format", "minLength",
    "maxLength",
    # annotations: they constrain nothing
    "title", "description", "default", "examples", "$comment", "$schema", "$id", "deprecated", "readOnly",
    "writeOnly",
})
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_BOUNDS = ("minLength", "maxLength", "minItems", "maxItems")
_QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")
_ROOT = re.compile(r"^root ::= ", re.MULTILINE)
_GBNF_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*|[()]', re.DOTALL)


def check_gbnf(text: str) -> None:
    """Raise ``ValueError`` if the GBNF ``text`` is too big or nested too deeply to hand to llama.cpp."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_GRAMMAR_BYTES:
        raise ValueError(f"the grammar is {size} bytes; at most {MAX_GRAMMAR_BYTES} are accepted")
    depth = deepest = 0
    for m in _GBNF_TOKEN.finditer(text):  # quoted literals, character classes and comments hold no groups
        depth += {"(": 1, ")": -1}.get(m.group(), 0)
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        raise ValueError(f"the grammar nests groups {deepest} deep; at most {MAX_DEPTH} are accepted")


def json_object_grammar() -> str:
    """GBNF for any JSON object (OpenAI's ``json_object`` mode)."""
    return json_schema_grammar({"type": "object"})


def json_schema_grammar(schema: Any) -> str:
    """GBNF whose every sentence is a JSON document valid under ``schema``; ``ValueError`` naming the first keyword
    (and where it is) that cannot be enforced, or why the schema cannot be converted."""
    _check_schema(schema, "")
    try:
        text: str = _converter().json_schema_to_gbnf(json.dumps(schema))  # a copy: it rewrites $refs in place
    except (AssertionError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise ValueError(f"the schema cannot be turned into a grammar: {e}") from None
    check_gbnf(text)
    return text


@functools.cache
def _converter() -> ModuleType:
    """llama-cpp-python's ``llama_grammar`` module, loaded from its file alone: the module is plain Python, but
    importing it as ``llama_cpp.llama_grammar`` would run the package's ``__init__``, which loads libllama (and with it
    the CUDA backend) into the API process, where no model is ever loaded."""
    package = importlib.util.find_spec("llama_cpp")  # finds the package without running it
    if package is None or not package.submodule_search_locations:
        raise ValueError("structured output needs llama-cpp-python's grammar converter, which is not installed")
    path = Path(next(iter(package.submodule_search_locations))) / "llama_grammar.py"
    spec = importlib.util.spec_from_file_location("llamafleet_llama_grammar", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"structured output needs llama-cpp-python's grammar converter ({path} cannot be loaded)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise ValueError(f"{where or 'the schema'} must be a JSON object (a schema), not {json.dumps(schema)[:40]}")
    for key, value in schema.items():
        here = f"{where}.{key}" if where else key
        if key not in KEYWORDS:
            raise ValueError(f"'{key}' (at {here}) cannot be enforced by this server's structured output; remove "
                             "it and check that constraint in your code")
        if key == "type" and any(t not in TYPES for t in (value if isinstance(value, list) else [value])):
            raise ValueError(f"{here} must be one of {', '.join(TYPES)} (or a list of them), not {value!r}")
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#/")):
            raise ValueError(f"$ref {value!r} (at {here}) is not supported: only references inside the schema "
                             "('#/$defs/...') are; put the referenced schema under $defs")
        elif key == "format" and value not in FORMATS:
            raise ValueError(f"format {value!r} (at {here}) cannot be enforced; supported formats: "
                             f"{', '.join(FORMATS)}")
        elif key in _BOUNDS and not (isinstance(value, int) and 0 <= value <= MAX_REPEAT):
            raise ValueError(f"{here} must be an integer from 0 to {MAX_REPEAT}, not {value!r}")
        elif key == "pattern":
            _check_pattern(value, here)
        elif key in _SUBSCHEMA_MAPS:
            if not isinstance(value, dict):
                raise ValueError(f"{here} must be an object of schemas")
            for name, sub in value.items():
                _check_schema(sub, f"{here}.{name}")
        elif key in _SUBSCHEMA_LISTS or (key == "items" and isinstance(value, list)):
            if not isinstance(value, list) or not value:
                raise ValueError(f"{here} must be a non-empty list of schemas")
            for i, sub in enumerate(value):
                _check_schema(sub, f"{here}[{i}]")
        elif key == "items" or (key == "additionalProperties" and not isinstance(value, bool)):
            _check_schema(value, here)
        elif key in ("required", "enum") and not isinstance(value, list):
            raise ValueError(f"{here} must be a list")


def _check_pattern(pattern: Any, where: str) -> None:
    if not isinstance(pattern, str) or not (pattern.startswith("^") and pattern.endswith("$")):
        raise ValueError(f"{where} must be a regular expression anchored with ^ and $, not {pattern!r}")
    for m in _QUANTIFIER.finditer(pattern):
        if any(n and int(n) > MAX_REPEAT for n in m.groups()):
            raise ValueError(f"{where}: the repetition {m.group()} exceeds {MAX_REPEAT}")


THINK_ROOT = "root ::= (think-open think-body think-close)? answer\n"
BARE_ROOT = "root ::= ((think-open think-body)? think-close)? answer\n"  # (the close marker may come alone)
OPENED_ROOT = "root ::= think-body think-close answer\n"


def after_thinking(grammar: str, think: tuple[str, str] | None, text: str = "", bare: bool = False) -> str:
    """``grammar`` with an optional think block (``think``: its open and close markers) before its sentences
    (unchanged when ``think`` is None), and ``text`` (what a family writes before plain text, such as Functionary
    v3.2's ``all\n``) before them; ``bare``: the close marker may also come alone, as MiniMax M3 opens an answer
    without thinking. The block's text may not hold the first two characters of its close marker in a row. When
    the prompt opened the block, the worker makes it required and unopened (:func:`inside_think`)."""
    if text:
        grammar = _ROOT.sub(lambda _: f"root ::= {json.dumps(text, ensure_ascii=False)} ", grammar, count=1)
    if think is None:
        return grammar
    open_, close = think
    a, b = (c.replace("\\", "\\\\").replace("]", "\\]").replace("[", "\\[") for c in close[:2])
    return ((BARE_ROOT if bare else THINK_ROOT)
            + f"think-open ::= {json.dumps(open_, ensure_ascii=False)}\n"
            + f"think-body ::= ([^{a}] | {json.dumps(close[0])} [^{b}])*\n"
            + f"think-close ::= {json.dumps(close, ensure_ascii=False)} \"\\n\"{{0,2}}\n"
            + _ROOT.sub("answer ::= ", grammar, count=1))


def inside_think(grammar: str) -> str:
    """``grammar`` for an answer that starts inside the think block its prompt opened: a grammar of
    :func:`after_thinking` then goes on in the block, which must be closed before the answer; others are unchanged."""
    for root in (THINK_ROOT, BARE_ROOT):
        if grammar.startswith(root):
            return OPENED_ROOT + grammar.removeprefix(root)
    return grammar
