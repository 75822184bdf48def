"""Which of the router's prefix keys an engine's KV holds: a slot's sequence by the share of its prompt computed, a
state given up by its slot followed by its tokens' name through the park, RAM and disk tiers, reported as changes."""

from __future__ import annotations

from llamafleet.engine.held_keys import HeldChange, HeldKeys, covered
from llamafleet.engine.kv_disk import entry_name
from llamafleet.engine.sequence import Sequence
from llamafleet.engine.types import Request

KEYS = tuple(range(100, 110))  # ten blocks of text


def _seq(rid: str, n_prompt: int = 200, keys: tuple[int, ...] = KEYS, share: float = 1.0) -> Sequence:
    return Sequence(Request(rid, tuple(range(n_prompt)), prefix_keys=keys, prefix_share=share), slot=0, chain=None)


def test_a_state_holds_the_keys_of_the_blocks_its_tokens_reach() -> None:
    assert covered(KEYS, 1.0, 200, 0) == ()
    assert covered(KEYS, 1.0, 200, 100) == KEYS[:5]
    assert covered(KEYS, 1.0, 200, 250) == KEYS  # the prompt and some of its answer
    assert covered(KEYS, 0.5, 200, 50) == KEYS[:5]  # the keys cover the first half of the text
    assert covered((), 1.0, 200, 200) == ()


def _sets(change: HeldChange | None) -> tuple[frozenset[int], ...] | None:
    """A change, its keys in no order (they come in the order of a set's iteration)."""
    return None if change is None else tuple(frozenset(f) for f in (change.added, change.dropped, change.disk_added,
                                                                     change.disk_dropped))


def _expect(**fields: tuple[int, ...]) -> tuple[frozenset[int], ...] | None:
    return _sets(HeldChange(**fields))


def _ended(s: Sequence, n_cached: int) -> Sequence:
    s.n_cached, s.done = n_cached, True
    return s


def test_a_slot_reports_the_keys_its_sequence_kept_once_it_ends_and_only_changes() -> None:
    held = HeldKeys()
    s = _seq("a")
    s.n_cached = 220
    assert held.change([(0, s)], [], [], []) is None  # running: the router counts it as in flight
    assert _sets(held.change([(0, _ended(s, 220))], [], [], [])) == _expect(added=KEYS)
    assert held.change([(0, s)], [], [], []) is None
    cancelled = _ended(_seq("c", keys=tuple(range(50, 60))), 100)  # half its prompt computed
    assert _sets(held.change([(0, s), (1, cancelled)], [], [], [])) == _expect(added=tuple(range(50, 55)))
    other = _ended(_seq("b", keys=KEYS[:3] + (7, 8)), 200)  # the same first three blocks, then its own
    assert _sets(held.change([(1, other)], [], [], [])) == _expect(added=(7, 8),  # (a and c were taken)
                                                                   dropped=KEYS[3:] + tuple(range(50, 55)))


def test_keys_follow_a_state_from_its_slot_through_park_ram_and_disk() -> None:
    held = HeldKeys()
    s = _ended(_seq("a"), 200)
    assert _sets(held.change([(0, s)], [], [], [])) == _expect(added=KEYS)
    held.tag(s)  # its slot is given to another prompt, which the tiers keep under its tokens' name
    tokens = s.tokens[:s.n_cached]
    name = entry_name(tokens)
    assert held.change([], [(9, tokens)], [], []) is None  # parked: held all along
    assert held.change([], [], [name], []) is None  # spilled from the park to RAM
    assert _sets(held.change([], [], [], [name])) == _expect(dropped=KEYS, disk_added=KEYS)  # from RAM to disk
    assert held.change([], [], [], [name]) is None
    assert _sets(held.change([], [], [], [])) == _expect(disk_dropped=KEYS)  # the disk tier evicted it
    # a name no longer held by any tier is forgotten: the same state seen again later has no keys
    assert held.change([], [], [name], []) is None


def test_a_state_no_tier_kept_leaves_no_keys_behind_and_shared_keys_stay_held() -> None:
    held = HeldKeys()
    a, b = _ended(_seq("a"), 200), _ended(_seq("b", keys=KEYS[:4] + (1, 2)), 200)
    held.change([(0, a), (1, b)], [], [], [])
    held.tag(a)  # given up, but no tier took it (a save not worth its cost)
    # b still holds the first four
    assert _sets(held.change([(1, b)], [], [], [])) == _expect(dropped=KEYS[4:])
    assert held.change([(1, b)], [], [entry_name(a.tokens[:200])], []) is None  # (its tag is gone)
