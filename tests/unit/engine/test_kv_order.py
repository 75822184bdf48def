"""Which state a full KV tier gives up (engine/kv_order.py): sessions taking turns in a cycle longer than the tier
hit where LRU hits nothing, and recency-friendly traffic still hits as under LRU.

The replay below is the park tier's flow with one slot: each turn takes the slot, so the KV the slot held (the
previous session's) is saved first, with the return interval learned when it was restored, then the session's own
state, if kept, leaves the tier for the slot."""

from __future__ import annotations

from collections import OrderedDict

from llamafleet.engine.kv_order import Clock, ReturnOrder


def replay(sessions: list[int], capacity: int, lru: bool = False) -> float:
    """The share of turns restored from a tier of ``capacity`` states (``lru``: the least recently saved goes)."""
    clock = Clock()
    order: ReturnOrder[int] = ReturnOrder(clock)
    store: OrderedDict[int, None] = OrderedDict()
    in_slot, interval, hits = None, None, 0
    for k in sessions:
        clock.tick()
        if in_slot is not None:
            if len(store) >= capacity:
                victim = next(iter(store)) if lru else order.victim(store)
                assert victim is not None
                del store[victim]
                order.drop(victim)
            store[in_slot] = None
            order.add(in_slot, interval)
        interval = None
        if k in store:
            hits += 1
            interval = order.hit(k)
            del store[k]
            order.drop(k)
        in_slot = k
    return hits / len(sessions)


def test_a_cycle_longer_than_the_tier_hits_where_lru_hits_nothing() -> None:
    for n, capacity in ((6, 4), (12, 4), (40, 16)):
        cycle = list(range(n)) * 10
        assert replay(cycle, capacity, lru=True) == 0.0
        # about capacity - 1 of every n turns, after the first round
        assert replay(cycle, capacity) >= 0.9 * (capacity - 1) / n * 9 / 10, (n, capacity)


def test_a_cycle_learned_late_still_hits() -> None:
    # a cycle 6x the tier from the start is beyond what is kept before anything is learned; after a shorter cycle
    # of the same sessions taught their interval, it hits
    assert replay(list(range(24)) * 6, 4) == 0.0
    assert replay(list(range(12)) * 4 + list(range(24)) * 6, 4) > 0.05


def test_sessions_that_fit_hit_every_later_turn() -> None:
    assert replay([0, 1, 2] * 10, 4) == replay([0, 1, 2] * 10, 4, lru=True) == 27 / 30


def test_recent_sessions_are_kept_and_a_new_set_takes_the_tier_over() -> None:
    # two sessions come back often among one-off visitors: kept (LRU loses them once 4 visitors passed)
    busy = [v for i in range(20) for v in (0, 1, 100 + 3 * i, 101 + 3 * i, 102 + 3 * i)]
    assert replay(busy, 4) >= 0.35 > replay(busy, 4, lru=True)
    # sessions 0-2 stop and 10-12 start: once the old ones are overdue the new ones hit as under LRU
    shift = [0, 1, 2] * 10 + [10, 11, 12] * 20
    tail = shift[30:]
    assert replay(shift, 4) >= replay(shift, 4, lru=True) - 4 / len(shift)
    assert replay(tail, 4) == 57 / 60
