"""Structured output on the way in: OpenAI's ``response_format`` (``json_object``, ``json_schema``) as a grammar the
engine samples under, and the one rule for every route that takes a format beside llama.cpp's ``grammar``
(:func:`constrained`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from llamafleet.api.errors import ApiError
from llamafleet.api.protocol import Request
from llamafleet.engine.families import Family
from llamafleet.engine.grammar import after_thinking, json_object_grammar, json_schema_grammar

FormatType = Literal["text", "json_object", "json_schema"]


class JsonSchemaFormat(Request):
    name: str
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # the schema is always enforced, strict or not
    description: str | None = None


class ResponseFormat(Request):
    type: FormatType
    json_schema: JsonSchemaFormat | None = None


def format_grammar(kind: FormatType, schema: dict[str, Any] | None, where: str,
                   family: Family | None = None) -> str | None:
    """The GBNF for a structured-output format (None for plain text), after ``family``'s optional think block;
    ``where`` names the schema's parameter, which a ``json_schema`` format needs, in the 400 when it is missing or
    cannot be enforced."""
    if kind == "text":
        return None
    think, text, bare = (None, "", False) if family is None else (family.think, family.text, family.bare_close)
    if kind == "json_object":
        return after_thinking(json_object_grammar(), think, text, bare)
    if schema is None:
        raise ApiError(400, f"missing required parameter '{where}'", param=where)
    try:
        return after_thinking(json_schema_grammar(schema), think, text, bare)
    except ValueError as e:
        raise ApiError(400, f"invalid '{where}': {e}", param=where) from None


def constrained(structured: str | None, grammar: str | None, ignore_eos: bool, param: str) -> str | None:
    """The one grammar a request samples under: its structured output format's (``param``) or its GBNF
    ``grammar``, not both; neither goes with ``ignore_eos``, since the grammar ends the answer."""
    if structured is not None and grammar is not None:
        raise ApiError(400, f"send '{param}' or 'grammar', not both", param="grammar")
    if (structured or grammar) and ignore_eos:
        raise ApiError(400, f"'ignore_eos' cannot be combined with '{param}' or 'grammar': the grammar ends the "
                            "answer; send false or null", param="ignore_eos")
    return structured or grammar
