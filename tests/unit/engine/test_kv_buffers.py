"""The RAM tier's state buffers (engine/kv_buffers.py): a buffer given back is lent to the next state that fits it
without wasting half of it, a new one has room for a longer state, and only a few are kept."""

from __future__ import annotations

from llamafleet.engine.kv_buffers import HEADROOM, KEEP, Buffers, capacity


def test_a_new_buffer_has_room_for_a_longer_state_and_a_given_back_one_is_lent_again() -> None:
    pool = Buffers()
    view = pool.take(1000)
    assert len(view) == 1000 and capacity(view) == 1000 + 1000 // HEADROOM and pool.bytes == 0
    buf = view.obj
    pool.give(view)
    assert pool.bytes == capacity(memoryview(buf))
    assert pool.new_bytes(1200) == 0 and pool.new_bytes(1300) == 1300 + 1300 // HEADROOM
    again = pool.take(1200)  # the same memory, longer
    assert again.obj is buf and len(again) == 1200 and pool.bytes == 0 and pool.reused == 1


def test_a_buffer_is_not_lent_to_a_state_of_less_than_half_its_size() -> None:
    pool = Buffers()
    pool.give(pool.take(1000))
    small = pool.take(400)
    assert capacity(small) == 400 + 400 // HEADROOM and pool.reused == 0 and pool.bytes == 1250


def test_only_a_few_buffers_are_kept_and_clear_frees_them() -> None:
    pool = Buffers()
    views = [pool.take(100) for _ in range(KEEP + 2)]
    for v in views:
        pool.give(v)
    assert pool.bytes == KEEP * 125
    pool.clear()
    assert pool.bytes == 0 and pool.new_bytes(100) == 125
