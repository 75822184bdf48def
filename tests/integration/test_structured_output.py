"""Structured output on the real demo model: grammar-constrained sampling in the engine (batched with plain greedy
sequences, at temperature 0 and 1) and through a real ``llamafleet serve`` with the OpenAI SDK (``parse`` with a
pydantic model, ``json_object``, llama.cpp's ``grammar``, the Responses API's ``text.format``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from conftest import FleetServer
from llamafleet.engine.engine import Engine
from llamafleet.engine.grammar import json_object_grammar, json_schema_grammar
from llamafleet.engine.types import EngineConfig, Request, SamplingParams
from llamafleet.model.demo import default_model_path

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"},
                   "height": {"type": "number"}, "color": {"enum": ["red", "green", "blue"]}},
    "required": ["name", "age", "height", "color"],
}
ASK = [{"role": "user", "content": "Describe a person as JSON: name, age, height in metres, favourite colour."}]


def valid_person(text: str) -> dict[str, Any]:
    doc = json.loads(text)
    assert set(doc) == {"name", "age", "height", "color"}, doc
    assert isinstance(doc["name"], str) and len(doc["name"]) <= 16
    assert isinstance(doc["age"], int) and isinstance(doc["height"], (int, float))
    assert doc["color"] in ("red", "green", "blue")
    return dict(doc)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    cfg = EngineConfig(model_path=str(default_model_path(progress=False)), n_seq=6, n_ctx_per_seq=256, n_batch=256)
    with Engine(cfg) as eng:
        yield eng


def test_constrained_answers_validate_and_leave_greedy_neighbours_unchanged(engine: Engine) -> None:
    prompt = tuple(engine.tokenize_chat(ASK))
    other = tuple(engine.tokenize("def fibonacci(n):"))
    g = json_schema_grammar(PERSON)
    plain = SamplingParams(max_tokens=40, temperature=0.0)
    reqs = [Request("greedy", prompt, SamplingParams(max_tokens=80, temperature=0.0, grammar=g)),
            Request("hot", prompt, SamplingParams(max_tokens=80, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
                                                  seed=7, grammar=g)),
            Request("penalised", prompt, SamplingParams(max_tokens=80, temperature=1.0, seed=3, grammar=g,
                                                        repeat_penalty=1.3)),  # the prompt primes penalties only
            Request("object", prompt, SamplingParams(max_tokens=80, temperature=1.0, seed=5,
                                                     grammar=json_object_grammar())),
            Request("plain", other, plain), Request("plain-chat", prompt, plain)]
    out = engine.generate(reqs)
    for rid in ("greedy", "hot", "penalised"):
        assert out[rid].finish_reason == "stop", out[rid]  # the grammar closed the object and ended the answer
        valid_person(out[rid].text)
    assert out["object"].finish_reason == "stop" and isinstance(json.loads(out["object"].text), dict)
    assert not out["plain-chat"].text.lstrip().startswith("{")  # unconstrained, the model does not answer in JSON
    alone = engine.generate([Request("plain", other, plain), Request("plain-chat", prompt, plain)])
    assert [alone[r].token_ids for r in ("plain", "plain-chat")] == [out[r].token_ids for r in ("plain", "plain-chat")]
    again = engine.generate([reqs[1]])  # seeded and constrained: reproducible
    assert again["hot"].text == out["hot"].text


def test_bad_and_dead_end_grammars_never_hurt_the_engine(engine: Engine) -> None:
    prompt = tuple(engine.tokenize("Say a:"))
    with pytest.raises(ValueError, match="does not parse as GBNF"):
        engine.add_request(Request("undefined", prompt, SamplingParams(grammar="root ::= nothing-here")))
    with pytest.raises(ValueError, match="does not parse as GBNF"):
        engine.add_request(Request("left", prompt, SamplingParams(grammar='root ::= root "a" | "b"')))
    # after "a" the grammar wants a character outside every character: no token fits, the answer just ends
    dead = SamplingParams(max_tokens=8, temperature=0.0, grammar='root ::= "a" [^\\x00-\\U0010FFFF]')
    out = engine.generate([Request("dead", prompt, dead), Request("fine", prompt, SamplingParams(max_tokens=4))])
    assert out["dead"].text == "a" and out["dead"].finish_reason == "stop"
    assert out["fine"].completion_tokens == 4


class Person(BaseModel):
    name: str
    age: int
    color: Literal["red", "green", "blue"]


@pytest.fixture(scope="module")
def served(fleet: FleetServer) -> tuple[OpenAI, str]:
    return fleet.client(), fleet.model()


def test_the_sdk_parses_a_pydantic_model(served: tuple[OpenAI, str]) -> None:
    client, model = served
    for temperature in (0.0, 1.0):
        done = client.chat.completions.parse(model=model, messages=ASK, response_format=Person, max_tokens=80,
                                             temperature=temperature, seed=11)
        person = done.choices[0].message.parsed
        assert isinstance(person, Person) and done.choices[0].finish_reason == "stop"


def test_json_object_mode_and_llama_cpp_grammar(served: tuple[OpenAI, str]) -> None:
    client, model = served
    done = client.chat.completions.create(model=model, messages=ASK, response_format={"type": "json_object"},
                                          max_tokens=80, n=2, temperature=1.0, seed=1)
    assert all(isinstance(json.loads(c.message.content or ""), dict) for c in done.choices)
    text = client.completions.create(model=model, prompt="The answer is", max_tokens=8,
                                     extra_body={"grammar": 'root ::= " yes" | " no"'})
    assert text.choices[0].text in (" yes", " no") and text.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=ASK, stream=True, max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}))
    valid_person(streamed)


def test_responses_text_format(served: tuple[OpenAI, str]) -> None:
    client, model = served
    done = client.responses.create(model=model, input=ASK[0]["content"], max_output_tokens=80, text={
        "format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    valid_person(done.output_text)


def test_refusals_through_the_server(served: tuple[OpenAI, str]) -> None:
    client, model = served
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "p", "schema": {"$ref": "https://example.com/p.json"}}})
    assert "only references inside the schema" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:  # parsed by llama.cpp in the replica: still the client's 400
        client.completions.create(model=model, prompt="x", max_tokens=4, extra_body={"grammar": "root ::= undefined"})
    assert "does not parse as GBNF" in e.value.message
    assert client.completions.create(model=model, prompt="x", max_tokens=2).choices[0].text is not None  # still up
