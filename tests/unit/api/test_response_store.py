"""The stored responses' bounds: count, bytes and age, oldest first; ownership by API key; OpenAI's 404s; a byte
count that never understates the memory held."""

from __future__ import annotations

import tracemalloc

import pytest

from llamafleet.api.errors import ApiError
from llamafleet.api.response_store import ResponseStore, footprint, owner_of


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def response(rid: str, text: str = "hi") -> dict[str, object]:
    return {"id": rid, "object": "response", "output": [{"type": "message", "role": "assistant",
                                                          "content": [{"type": "output_text", "text": text}]}]}


def item(text: str) -> dict[str, object]:
    return {"id": "msg_1", "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def size(rid: str, text: str, inputs: tuple[dict[str, object], ...]) -> int:
    return footprint(response(rid, text)) + footprint(inputs)


def test_a_stored_response_continues_with_its_inputs_then_its_output() -> None:
    store = ResponseStore(10, 1 << 20, 60)
    assert store.put("r1", "", response("r1", "answer"), (item("question"),))
    conversation = store.get("r1", "").conversation
    assert [c["role"] for c in conversation] == ["user", "assistant"]  # type: ignore[index]


def test_count_bound_drops_the_oldest() -> None:
    store = ResponseStore(3, 1 << 20, 60)
    for i in range(5):
        store.put(f"r{i}", "", response(f"r{i}"), ())
    assert len(store) == 3
    for gone in ("r0", "r1"):
        with pytest.raises(ApiError):
            store.get(gone, "")
    assert store.get("r4", "").response["id"] == "r4"


def test_byte_bound_drops_the_oldest_and_counts_exactly() -> None:
    inputs = (item("x" * 1000),)
    one = size("r0", "hi", inputs)
    store = ResponseStore(100, 3 * one + one // 2, 60)
    for i in range(10):
        assert store.put(f"r{i}", "", response(f"r{i}"), inputs)
        assert store.bytes <= store.max_bytes
    assert len(store) == 3 and store.bytes == 3 * one
    store.delete("r9", "")
    assert store.bytes == 2 * one


def test_a_response_larger_than_the_bound_is_not_kept() -> None:
    store = ResponseStore(100, 2000, 60)
    store.put("small", "", response("small"), ())
    assert not store.put("big", "", response("big"), (item("y" * 5000),))
    with pytest.raises(ApiError):
        store.get("big", "")
    assert store.get("small", "")  # nothing else was dropped for it


def test_a_store_of_no_responses_keeps_none() -> None:
    store = ResponseStore(0, 1 << 20, 60)
    assert not store.put("r1", "", response("r1"), ())
    assert len(store) == 0 and store.bytes == 0


def test_a_client_cannot_grow_the_store_by_continuing_forever() -> None:
    """A conversation continued turn after turn carries its whole history in every response: the count bound and
    the byte bound both hold, whatever the client sends."""
    store = ResponseStore(50, 64 << 10, 3600)
    history: tuple[dict[str, object], ...] = ()
    for i in range(300):
        history = (*history, item(f"turn {i} " + "z" * 200))
        store.put(f"r{i}", "", response(f"r{i}"), history)
        assert store.bytes <= store.max_bytes and len(store) <= store.max_count
    assert 0 < len(store) < 50  # the bytes bound cut in before the count did


def test_responses_expire_after_the_ttl() -> None:
    clock = Clock()
    store = ResponseStore(10, 1 << 20, 60, clock)
    store.put("old", "", response("old"), ())
    clock.now += 30
    store.put("new", "", response("new"), ())
    clock.now += 31
    with pytest.raises(ApiError) as e:
        store.get("old", "", "previous_response_id")
    assert e.value.status == 404 and e.value.code == "previous_response_not_found"
    assert e.value.param == "previous_response_id"
    assert store.get("new", "")
    assert len(store) == 1 and store.bytes == size("new", "hi", ())


def test_another_key_sees_a_404_like_an_unknown_id() -> None:
    store = ResponseStore(10, 1 << 20, 60)
    store.put("r1", "alice", response("r1"), ())
    with pytest.raises(ApiError) as theirs:
        store.get("r1", "bob")
    with pytest.raises(ApiError) as unknown:
        store.get("r2", "bob")
    assert theirs.value.status == unknown.value.status == 404
    assert theirs.value.body().error.message == "Response with id 'r1' not found."
    with pytest.raises(ApiError):
        store.delete("r1", "bob")
    assert store.get("r1", "alice")  # bob's delete did nothing


def test_the_byte_count_never_understates_the_memory_held() -> None:
    store = ResponseStore(10_000, 1 << 40, 3600)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        history: tuple[dict[str, object], ...] = ()
        for i in range(500):  # small answers (the most overhead per byte of text), some continuing others
            history = history[-6:] + (item(f"q{i}"),)
            store.put(f"r{i}", "", response(f"r{i}", f"answer {i}"), history)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert store.bytes >= held, (store.bytes, held)


@pytest.mark.parametrize(("headers", "same_as"), [
    ([(b"authorization", b"Bearer k1")], [(b"x-api-key", b"k1")]),
    ([(b"authorization", b"Bearer  k1 ")], [(b"authorization", b"bearer k1")]),
])
def test_the_owner_is_the_key_however_it_is_sent(headers: list[tuple[bytes, bytes]],
                                                 same_as: list[tuple[bytes, bytes]]) -> None:
    owner = owner_of({"headers": headers})
    assert owner == owner_of({"headers": same_as}) != owner_of({"headers": [(b"x-api-key", b"k2")]})
    assert owner_of({"headers": []}) == "" and "k1" not in owner
