"""Which slot a new prompt takes and what KV it starts from (engine/prefix.py: pure logic, no llama.cpp)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llamafleet.engine.prefix import MIN_REUSE, SlotIndex, common_prefix

SYSTEM = list(range(1000, 1100))  # a 100-token shared prefix (a system prompt)


@dataclass(eq=False)
class Seq:
    slot: int
    tokens: list[int] = field(default_factory=list)
    n_cached: int = 0
    n_prompt: int = 0


def run(index: SlotIndex[Seq], prompt: list[int], generated: int = 0, done: bool = True) -> Seq:
    """Place ``prompt``, take the slot, and (if ``done``) compute it all and release the slot."""
    place = index.place(prompt)
    s = Seq(place.slot, prompt + [7] * generated, n_cached=len(prompt) + generated, n_prompt=len(prompt))
    index.take(s)
    if done:
        index.release(s.slot)
    return s


def test_common_prefix() -> None:
    a = list(range(50))
    assert common_prefix(a, a, 100) == 50
    assert common_prefix(a, a, 20) == 20
    assert common_prefix(a, [*a[:37], -1, *a[38:]], 100) == 37
    assert common_prefix(a, [-1], 100) == 0
    assert common_prefix(a, [], 100) == 0
    assert common_prefix(a, a[:1], 100) == 1
    for cut in range(1, 50):
        assert common_prefix(a, a[:cut] + [-5] * 10, 100) == cut


def test_without_reuse_the_lowest_free_slot_and_nothing_kept() -> None:
    index = SlotIndex[Seq](4, enabled=False)
    run(index, SYSTEM + [1])
    place = index.place(SYSTEM + [2])
    assert (place.slot, place.reuse, place.source) == (0, 0, None)


def test_a_finished_sequence_is_reused_in_place_up_to_the_last_prompt_token() -> None:
    index = SlotIndex[Seq](4)
    run(index, [5] * 3, done=False)  # slot 0, running
    first = run(index, SYSTEM + [1, 2, 3], generated=20, done=False)  # slot 1
    assert first.slot == 1
    index.release(1)
    # turn 2: the whole of turn 1 (prompt + answer) and more
    turn2 = first.tokens + [9, 9, 9]
    place = index.place(turn2)
    assert (place.slot, place.reuse, place.source) == (1, len(first.tokens), None)
    # the very same prompt again: all but its last token, which is decoded again for the logits
    place = index.place(SYSTEM + [1, 2, 3])
    assert (place.slot, place.reuse) == (1, len(SYSTEM) + 2)


def test_a_short_match_does_not_leave_the_slot_order_but_the_lowest_slot_keeps_its_own() -> None:
    index = SlotIndex[Seq](4)
    low = run(index, [1, 2, 3, 4, 5], done=False)  # slot 0
    held = run(index, [8] * (MIN_REUSE - 1) + [3], done=False)  # slot 1
    index.release(held.slot)
    index.release(low.slot)
    place = index.place([8] * (MIN_REUSE - 1) + [4])  # MIN_REUSE - 1 tokens in slot 1: not worth a gap
    assert (place.slot, place.reuse) == (0, 0)
    place = index.place([1, 2, 3, 9])  # the lowest free slot holds 3 of them: kept, whatever the length
    assert (place.slot, place.reuse) == (0, 3)


def test_equal_matches_take_the_least_recently_used_slot() -> None:
    index = SlotIndex[Seq](4)
    a, b, c = (run(index, SYSTEM + [i], done=False) for i in (1, 2, 3))
    for s in (b, a, c):  # b was released first: least recently used
        index.release(s.slot)
    place = index.place(SYSTEM + [4])
    assert (place.slot, place.reuse, place.source) == (b.slot, len(SYSTEM), None)


def test_a_prefix_in_another_slot_is_copied_into_the_lowest_free_slot() -> None:
    index = SlotIndex[Seq](4)
    busy = run(index, SYSTEM + [1], generated=5, done=False)  # running in slot 0
    place = index.place(SYSTEM + [2, 3])
    assert (place.slot, place.reuse, place.source, place.wait) == (1, len(SYSTEM), busy, False)


def test_a_copy_must_gain_enough_over_what_is_reused_in_place() -> None:
    index = SlotIndex[Seq](4)
    run(index, SYSTEM[:80] + [1])  # slot 0: 80 tokens of the prefix
    index.take(Seq(1, SYSTEM + [2], n_cached=len(SYSTEM) + 1, n_prompt=len(SYSTEM) + 1))  # running, 100 tokens
    assert index.place(SYSTEM + [5]).source is None  # 100 vs 80 in place: less than MIN_REUSE more
    longer = SYSTEM + list(range(2000, 2000 + MIN_REUSE))
    index.take(Seq(2, [*longer, 3], n_cached=len(longer) + 1, n_prompt=len(longer) + 1))
    place = index.place([*longer, 5])
    assert (place.slot, place.reuse, place.source is not None) == (0, len(longer), True)


def test_a_prefix_still_being_prefilled_is_waited_for() -> None:
    index = SlotIndex[Seq](4)
    lead = Seq(0, SYSTEM + [1], n_cached=0, n_prompt=len(SYSTEM) + 1)  # admitted this step, nothing computed
    index.take(lead)
    place = index.place(SYSTEM + [2])
    assert (place.slot, place.reuse, place.source, place.wait) == (1, len(SYSTEM), lead, True)
    lead.n_cached = len(SYSTEM) + 1  # its prefill is done: a plain copy now
    place = index.place(SYSTEM + [2])
    assert (place.source, place.wait) == (lead, False)


def test_a_forgotten_slot_offers_nothing_and_holds_tells_whose_kv_a_slot_has() -> None:
    index = SlotIndex[Seq](2)
    s = run(index, SYSTEM + [1], done=False)
    assert index.holds(s)
    index.release(s.slot, keep=False)
    assert not index.holds(s)
    assert index.place(SYSTEM + [1, 2]).reuse == 0
    assert index.n_free == 2


def test_a_placement_names_the_kv_it_gives_up_and_the_longest_prefix_held() -> None:
    """What the KV tiers need: the sequence whose KV the chosen slot held (saved before it is overwritten), and how
    far the prompt matched anything held (where a miss differed)."""
    index = SlotIndex[Seq](2)
    a = run(index, SYSTEM + [1] * 50, done=False)  # slot 0
    b = run(index, [3] * 80, done=False)  # slot 1, running
    index.release(a.slot)  # slot 0: free and warm
    place = index.place([3] * 10 + [4] * 40)  # matches b for 10 tokens: too few to copy, the lowest free slot
    assert (place.slot, place.reuse, place.lost, place.best) == (0, 0, a, 10)
    place = index.place(SYSTEM + [1] * 20 + [2])  # in place: a's KV is kept but for its tail
    assert (place.slot, place.reuse, place.lost) == (0, 120, a)
    index.release(b.slot)
    assert index.contents() == [(1, b.tokens), (0, a.tokens)]  # most recently used first
