"""Stored responses through a real ``llamafleet serve``, with the OpenAI SDK: ``previous_response_id`` continues a
conversation (whole and streamed, and with tools, a call answered by a ``function_call_output`` item) and only the new
input is prefilled, by the usage's cached tokens; ``retrieve``, ``delete`` and ``input_items.list``; ``store: false``;
a response belongs to the API key that created it; unknown and deleted ids are OpenAI's 404s."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai import OpenAI

from conftest import FleetServer

pytestmark = pytest.mark.each_engine

# long enough (over 256 characters) for prefix routing to send the next turn to the replica that holds it
QUESTION = ("You are helping plan a small garden behind a house in a mild, dry climate. The beds get six hours of sun "
            "a day, the soil is sandy and drains fast, water is limited to one can a day, and the owner wants "
            "vegetables that are easy to grow for a beginner. Name one vegetable that suits it.")
WEATHER: dict[str, Any] = {
    "type": "function", "name": "get_weather", "description": "The current weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                   "required": ["city"], "additionalProperties": False},
}


def keyed(fleet: FleetServer, key: str) -> OpenAI:
    """A client of the shared server that presents ``key`` (authentication is off there: the key only says whose
    stored responses are whose)."""
    return OpenAI(base_url=f"{fleet.url}/v1", api_key=key, max_retries=0, timeout=120.0)


@pytest.fixture(scope="module")
def alice(fleet: FleetServer) -> OpenAI:
    return keyed(fleet, "alice-key")


def new_prefill(response: Any) -> int:
    usage = response.usage
    return int(usage.input_tokens - usage.input_tokens_details.cached_tokens)


def test_a_continued_conversation_prefills_only_the_new_input(fleet: FleetServer, alice: OpenAI, model: str) -> None:
    first = alice.responses.create(model=model, input=QUESTION, temperature=0.0, max_output_tokens=24)
    assert first.store and first.previous_response_id is None and first.usage is not None
    second = alice.responses.create(model=model, previous_response_id=first.id, input="Why that one?",
                                    temperature=0.0, max_output_tokens=8)
    assert second.previous_response_id == first.id and second.usage is not None
    # the whole conversation was the prompt: the first question and answer, then the new turn
    assert second.usage.input_tokens >= first.usage.input_tokens + first.usage.output_tokens
    # and what the first request computed was reused: only the answer's end, the markup and the new question are new
    # (where the engine keeps a prefix cache: the torch engine computes every prompt whole)
    assert fleet.engine == "torch" or second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    assert fleet.engine == "torch" or new_prefill(second) <= first.usage.output_tokens + 20, second.usage
    # the same conversation sent whole, without the store, is the same prompt
    whole = alice.responses.create(model=model, store=False, temperature=0.0, max_output_tokens=8, input=[
        {"role": "user", "content": QUESTION}, *first.output, {"role": "user", "content": "Why that one?"}])
    assert whole.usage is not None and whole.usage.input_tokens == second.usage.input_tokens
    assert whole.output_text == second.output_text


def test_a_streamed_continuation_is_stored_and_continued_too(fleet: FleetServer, alice: OpenAI, model: str) -> None:
    first = alice.responses.create(model=model, input=QUESTION, temperature=0.0, max_output_tokens=16, stream=True)
    events = list(first)
    created, done = events[0], events[-1]
    assert created.type == "response.created" and created.response.store  # type: ignore[union-attr]
    assert done.type in ("response.completed", "response.incomplete")
    rid = done.response.id  # type: ignore[union-attr]
    stored = alice.responses.retrieve(rid)
    assert stored.output_text == done.response.output_text  # type: ignore[union-attr]
    second = list(alice.responses.create(model=model, previous_response_id=rid, input="Thanks. One more?",
                                         temperature=0.0, max_output_tokens=8, stream=True))
    final: Any = second[-1]
    assert final.type in ("response.completed", "response.incomplete") and final.response.previous_response_id == rid
    if fleet.engine == "llama.cpp":  # its prefix cache held the conversation (the torch engine keeps none)
        assert final.response.usage.input_tokens_details.cached_tokens >= stored.usage.input_tokens  # type: ignore
        assert new_prefill(final.response) <= stored.usage.output_tokens + 20  # type: ignore[union-attr]


@pytest.mark.llama_cpp_only(reason="tool_choice required is a grammar, which the torch engine refuses")
def test_a_tool_call_is_answered_by_its_output_item_alone(alice: OpenAI, model: str) -> None:
    ask = "What is the weather in Paris?"
    first = alice.responses.create(model=model, input=ask, tools=[WEATHER], tool_choice="required",  # type: ignore
                                   parallel_tool_calls=False, temperature=0.0, max_output_tokens=60)
    (call,) = [item for item in first.output if item.type == "function_call"]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"sky": "clear"})}
    # tools sent again (they are not carried over), shown the same way ("auto" shows them as "required" did)
    final = alice.responses.create(model=model, previous_response_id=first.id, input=[result],  # type: ignore
                                   tools=[WEATHER], temperature=0.0, max_output_tokens=12)  # type: ignore[list-item]
    stateless = alice.responses.create(model=model, store=False, tools=[WEATHER],  # type: ignore[list-item]
                                       temperature=0.0, max_output_tokens=12,
                                       input=[{"role": "user", "content": ask}, *first.output, result])  # type: ignore
    assert final.usage is not None and stateless.usage is not None
    assert final.usage.input_tokens == stateless.usage.input_tokens
    assert [(i.type, getattr(i, "arguments", None)) for i in final.output] == \
        [(i.type, getattr(i, "arguments", None)) for i in stateless.output]
    assert final.output_text == stateless.output_text
    assert final.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens  # type: ignore[union-attr]
    items = alice.responses.input_items.list(final.id, order="asc")
    assert [i.type for i in items.data] == ["message", "function_call", "function_call_output"]
    assert items.data[1].call_id == call.call_id  # type: ignore[union-attr]


def test_retrieve_input_items_and_delete(alice: OpenAI, model: str) -> None:
    first = alice.responses.create(model=model, input="Say yes.", max_output_tokens=4, instructions="Be brief.")
    second = alice.responses.create(model=model, previous_response_id=first.id, input="Again.", max_output_tokens=4)
    got = alice.responses.retrieve(second.id)
    assert got.id == second.id and got.output_text == second.output_text and got.previous_response_id == first.id
    items = alice.responses.input_items.list(second.id)  # newest first
    texts = [(i.role, i.content[0].text) for i in items.data]  # type: ignore[union-attr]
    assert texts == [("user", "Again."), ("assistant", first.output_text), ("user", "Say yes.")]
    page = alice.responses.input_items.list(second.id, order="asc", limit=1, after=items.data[-1].id)
    assert [i.id for i in page.data] == [items.data[1].id] and page.has_more
    alice.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError) as e:
        alice.responses.create(model=model, previous_response_id=second.id, input="More.", max_output_tokens=4)
    assert e.value.body == {"message": f"Previous response with id '{second.id}' not found.",
                            "type": "invalid_request_error", "param": "previous_response_id",
                            "code": "previous_response_not_found"}
    assert alice.responses.retrieve(first.id).id == first.id  # deleting one keeps the one it continued


def test_store_false_keeps_nothing(alice: OpenAI, model: str) -> None:
    r = alice.responses.create(model=model, input="Say no.", max_output_tokens=4, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.create(model=model, previous_response_id=r.id, input="More.", max_output_tokens=4)


def test_a_response_belongs_to_its_key(alice: OpenAI, fleet: FleetServer, model: str) -> None:
    mine = alice.responses.create(model=model, input="Say hi.", max_output_tokens=4)
    with keyed(fleet, "bob-key") as bob:
        for attempt in (lambda: bob.responses.retrieve(mine.id), lambda: bob.responses.delete(mine.id),
                        lambda: bob.responses.input_items.list(mine.id),
                        lambda: bob.responses.create(model=model, previous_response_id=mine.id, input="Hi.",
                                                     max_output_tokens=4)):
            with pytest.raises(openai.NotFoundError):
                attempt()
        with pytest.raises(openai.NotFoundError) as unknown:
            bob.responses.retrieve("resp_doesnotexist")
    assert unknown.value.body == {"message": "Response with id 'resp_doesnotexist' not found.",
                                  "type": "invalid_request_error", "param": None, "code": None}
    assert alice.responses.retrieve(mine.id).id == mine.id  # still there for its owner
