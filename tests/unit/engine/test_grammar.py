"""JSON schema -> GBNF (engine/grammar.py): what converts, and the refusals that name what cannot be enforced.

Whether llama.cpp accepts the GBNF and the answers parse is tested on the real model in
tests/integration/test_structured_output.py; here the conversion and the limits are plain Python.
"""

from __future__ import annotations

from typing import Any

import pytest

from llamafleet.engine.grammar import MAX_DEPTH, MAX_GRAMMAR_BYTES, check_gbnf, json_object_grammar, json_schema_grammar
from llamafleet.engine.types import SamplingParams

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                   "color": {"enum": ["red", "green"]}, "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}}},
    "required": ["name", "age", "color"],
    "$defs": {"Tag": {"type": "string", "title": "Tag", "description": "annotations are fine"}},
}


def test_a_schema_becomes_a_grammar_rooted_at_an_object_with_its_keys_and_enum() -> None:
    g = json_schema_grammar(PERSON)
    rules = dict(line.split(" ::= ", 1) for line in g.splitlines())
    assert rules["root"].startswith('"{" space name-kv "," space age-kv "," space color-kv')  # required, in order
    assert rules["color"] == '"\\"red\\"" | "\\"green\\""'
    assert rules["tags-item"] == "string"  # the optional array, its item through the $ref
    assert PERSON["properties"]["tags"]["items"] == {"$ref": "#/$defs/Tag"}  # the client's schema is not rewritten


def test_json_object_mode_is_any_object() -> None:
    assert "root ::= object" in json_object_grammar().splitlines()


@pytest.mark.parametrize(("schema", "words"), [
    ({"type": "object", "properties": {"n": {"type": "number", "maximum": 3}}},
     "'maximum' (at properties.n.maximum) cannot be enforced"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "'uniqueItems' (at uniqueItems)"),
    ({"$ref": "https://example.com/a.json"}, "only references inside the schema"),
    ({"$ref": "other.json#/x"}, "only references inside the schema"),
    ({"type": "string", "format": "email"}, "format 'email' (at format) cannot be enforced"),
    ({"type": "string", "maxLength": 10**9}, "maxLength must be an integer from 0 to 1000"),
    ({"type": "string", "pattern": "^a{5000}$"}, "the repetition {5000} exceeds 1000"),
    ({"type": "string", "pattern": "abc"}, "anchored with ^ and $"),
    ({"type": "string", "pattern": "^(?=a)b$"}, "cannot be turned into a grammar"),
    ({"type": "object", "properties": {"a": "string"}}, "properties.a must be a JSON object"),
    ({"type": "text"}, "type must be one of"),
    ({"anyOf": []}, "anyOf must be a non-empty list"),
    ([1, 2], "the schema must be a JSON object"),
])
def test_what_cannot_be_enforced_is_refused_by_name(schema: Any, words: str) -> None:
    with pytest.raises(ValueError) as e:
        json_schema_grammar(schema)
    assert words in str(e.value)


def test_gbnf_limits_count_only_real_groups() -> None:
    check_gbnf('root ::= "((((" [()] x  # ((((\nx ::= ("a")')  # literals, classes and comments hold no groups
    deep = "root ::= " + "(" * (MAX_DEPTH + 1) + '"a"' + ")" * (MAX_DEPTH + 1)
    with pytest.raises(ValueError, match=f"nests groups {MAX_DEPTH + 1} deep"):
        check_gbnf(deep)
    with pytest.raises(ValueError, match="bytes; at most"):
        check_gbnf('root ::= "' + "a" * MAX_GRAMMAR_BYTES + '"')


def test_sampling_params_check_their_grammar() -> None:
    assert SamplingParams(grammar='root ::= "a"').grammar == 'root ::= "a"'
    with pytest.raises(ValueError, match="ignore_eos cannot be combined with a grammar"):
        SamplingParams(grammar='root ::= "a"', ignore_eos=True)
    with pytest.raises(ValueError, match="must not be empty"):
        SamplingParams(grammar="  ")
    with pytest.raises(ValueError, match="nests groups"):
        SamplingParams(grammar="root ::= " + "(" * 5000 + '"a"' + ")" * 5000)
