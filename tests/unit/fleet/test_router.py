"""The router: least outstanding work with round-robin ties, the seed's round robin, and the request map."""

from __future__ import annotations

from collections.abc import Callable, Collection

import pytest

from llamafleet.engine.held_keys import HeldChange
from llamafleet.fleet.affinity import Prompt, prefix_keys
from llamafleet.fleet.router import MIN_PREFIX_CHARS, NoReplicaError, QueueFullError, Router


def _router(slots: list[int], policy: str = "least_outstanding") -> Router:
    r = Router(len(slots), policy)  # type: ignore[arg-type]
    for i, s in enumerate(slots):
        r.set_up(i, s)
    return r


def test_idle_replicas_take_turns() -> None:
    r = _router([4, 4])
    picks = []
    for i in range(4):
        picks.append(r.assign(f"a{i}"))
        r.release(f"a{i}")  # each finishes before the next arrives: loads stay equal, so ties rotate
    assert picks == [0, 1, 0, 1]


def test_least_outstanding_fills_the_emptier_replica() -> None:
    r = _router([4, 4])
    assert [r.assign(f"x{i}") for i in range(4)] == [0, 1, 0, 1]
    r.release("x0")
    r.release("x2")  # replica 0 is now idle, replica 1 has two in flight
    assert [r.assign("y0"), r.assign("y1")] == [0, 0]
    assert r.outstanding(0) == 2 and r.outstanding(1) == 2


def test_load_is_measured_against_slots() -> None:
    r = _router([1, 4])  # a small and a big replica: the big one fills to 3/4 before the small one's 1/1 ties
    assert [r.assign(f"s{i}") for i in range(5)] == [1, 1, 1, 0, 1]
    assert r.outstanding(0) == 1 and r.outstanding(1) == 4


def test_round_robin_ignores_load() -> None:
    r = _router([4, 4, 4], policy="round_robin")
    assert [r.assign(f"r{i}") for i in range(6)] == [0, 1, 2, 0, 1, 2]
    r.release("r0")
    r.release("r3")
    assert r.assign("r6") == 0  # its turn, though it is also the emptiest


def test_request_map_and_release() -> None:
    r = _router([2, 2])
    a = r.assign("a")
    assert r.replica_of("a") == a
    assert r.release("a") == a
    assert r.replica_of("a") is None
    assert r.release("a") is None  # releasing twice is harmless
    assert r.outstanding(a) == 0


def test_down_replica_returns_its_requests_and_gets_no_more() -> None:
    r = _router([2, 2])
    placed = {rid: r.assign(rid) for rid in ("a", "b", "c", "d")}
    lost = r.set_down(1)
    assert sorted(lost) == sorted(rid for rid, rep in placed.items() if rep == 1)
    assert all(r.replica_of(rid) is None for rid in lost)
    assert r.outstanding(1) == 0
    assert {r.assign(f"n{i}") for i in range(3)} == {0}
    with pytest.raises(NoReplicaError, match="no replica that can serve"):  # down, not merely full
        r.assign("only-1", able=[1])
    r.set_up(1, 2)
    assert r.assign("back") == 1  # the emptiest again


def test_no_replica_up() -> None:
    r = Router(2)
    with pytest.raises(NoReplicaError, match="no replica is ready"):
        r.assign("a")
    r.set_up(0, 1)
    r.set_down(0)
    with pytest.raises(NoReplicaError):
        r.assign("a")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown routing policy 'random'"):
        Router(2, "random")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one replica"):
        Router(0)
    r = _router([1])
    r.assign("a")
    with pytest.raises(ValueError, match="already in flight"):
        r.assign("a")
    with pytest.raises(ValueError, match="at least one"):
        r.set_up(0, 0)


# -- prefix-aware routing -------------------------------------------------------------------------------------------
LONG = "You are the support assistant of a bicycle shop. Be brief, precise and friendly. " * 5  # 410 characters


def _distinct_long(rid: str) -> str:
    return f"{rid}: " + "this prompt shares its very first block with no other prompt. " * 8


def _same_short(rid: str) -> str:
    return LONG[:MIN_PREFIX_CHARS - 1]  # the same text every time, but too short to be worth any imbalance


@pytest.mark.parametrize("prompt_of", [_distinct_long, _same_short])
@pytest.mark.parametrize("test", [test_idle_replicas_take_turns, test_least_outstanding_fills_the_emptier_replica,
                                  test_load_is_measured_against_slots, test_request_map_and_release,
                                  test_down_replica_returns_its_requests_and_gets_no_more])
def test_prefix_routing_without_a_shared_prefix_is_least_outstanding_exactly(
        test: Callable[[], None], prompt_of: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The least_outstanding tests above, run unchanged on a prefix router whose requests share no prefix worth it."""
    routers: list[Router] = []

    class WithPrompts(Router):
        def assign(self, request_id: str, prompt: Prompt = "", able: Collection[int] | None = None) -> int:
            return super().assign(request_id, prompt_of(request_id), able)

    def prefix_router(slots: list[int], policy: str = "least_outstanding") -> Router:
        assert policy == "least_outstanding"
        r = WithPrompts(len(slots), "prefix")
        for i, s in enumerate(slots):
            r.set_up(i, s)
        routers.append(r)
        return r

    monkeypatch.setitem(globals(), "_router", prefix_router)
    test()
    assert routers and all(set(r.decisions) == {"load"} for r in routers)


def test_prefix_wins_when_loads_are_close() -> None:
    r = _router([4, 4], "prefix")
    assert r.assign("turn1", LONG + "First question?") == 0
    r.release("turn1")
    assert r.assign("turn2", LONG + "First question? An answer. Second question?") == 0  # least_outstanding: 1
    assert r.assign("other", "Unrelated. " * 40) == 1
    # replica 0 now runs turn2 and replica 1 runs "other": equal loads, the holder takes it
    assert r.assign("turn2b", LONG + "First question? Another follow-up.") == 0
    # 3/4 on the holder against 2/4: a quarter of the slots apart is still close
    assert r.assign("turn2c", LONG + "First question? Yet another.") == 0
    assert r.decisions == {"load": 2, "prefix": 3}


def test_load_wins_when_the_holder_is_clearly_busier() -> None:
    r = _router([4, 4], "prefix")
    assert [r.assign("a", LONG), r.assign("b", "Unrelated. " * 40)] == [0, 1]
    r.release("b")
    assert r.assign("c", "Another unrelated prompt. " * 20) == 1
    r.release("c")
    r.assign("d", LONG + " again")  # the holder: 2/4 against 1/4 after one more
    assert r.replica_of("d") == 0
    # 3/4 against 1/4: more than a quarter of the slots apart
    assert r.assign("e", LONG + " once more") == 1
    assert r.decisions["prefix_overridden_by_load"] == 1
    # replica 1 holds it now too: the tie between holders goes to the less loaded (0: 2/4 -> 3/4, 1: 1/4 -> 2/4)
    assert r.assign("f", LONG + " and again") == 1
    assert r.decisions["prefix"] == 2


def test_load_wins_when_the_sequence_would_wait_on_the_holder_while_another_slot_is_free() -> None:
    r = _router([8, 8], "prefix")
    assert r.assign("hold", LONG) == 0
    for i in range(14):
        r.assign(f"other{i}", f"{i} unrelated " * 30)
    assert (r.outstanding(0), r.outstanding(1)) == (8, 7)
    # 9/8 against 8/8 is within the margin, but on the holder it would wait for a slot while replica 1 has one free
    assert r.clearly_busier(0, 1)
    assert r.assign("waits", LONG + " the last one") == 1
    assert r.decisions["prefix_overridden_by_load"] == 1


def test_copies_of_one_prompt_stay_together_until_the_holder_is_clearly_busier() -> None:
    r = _router([4, 4], "prefix")
    assert [r.assign(f"n{i}", LONG) for i in range(4)] == [0, 0, 1, 1]
    r = _router([8, 8], "prefix")
    assert [r.assign(f"n{i}", LONG) for i in range(4)] == [0, 0, 0, 1]


def test_a_replica_that_goes_down_forgets_its_prefixes() -> None:
    r = _router([4, 4], "prefix")
    assert r.assign("a", LONG) == 0
    r.release("a")
    r.set_down(0)
    r.set_up(0, 4)  # restarted: its cache is empty
    assert r.assign("b", LONG) == 1  # least_outstanding's turn, not the old holder
    assert r.decisions == {"load": 2}


def test_every_policy_counts_its_decisions() -> None:
    rr = _router([2, 2], "round_robin")
    lo = _router([2, 2], "least_outstanding")
    for i in range(3):
        rr.assign(f"r{i}", LONG)
        lo.assign(f"l{i}", LONG)
    assert rr.decisions == {"round_robin": 3} and lo.decisions == {"load": 3}


def test_a_suspect_replica_gets_new_work_only_when_no_other_can_take_it() -> None:
    r = Router(2, "least_outstanding", max_queue_per_replica=1)
    r.set_up(0, 1)
    r.set_up(1, 1)
    r.set_suspect(1, True)
    assert [r.assign(f"a{i}") for i in range(2)] == [0, 0]  # a slot and a queue place on the healthy one
    assert r.assign("a2") == 1  # the healthy one is full: the suspect one is all there is (it waits there)
    r.set_suspect(1, False)
    r.release("a2")
    r.release("a1")
    assert r.assign("b") == 1  # back in rotation


def test_a_sequence_moves_to_a_healthy_replica_with_room_never_one_it_must_avoid() -> None:
    r = Router(3, "least_outstanding", max_queue_per_replica=0)
    for i in range(3):
        r.set_up(i, 1)
    assert [r.assign(x) for x in "abc"] == [0, 1, 2]
    r.set_suspect(0, True)
    assert r.move("a", avoid=()) is None  # every other replica is full: nothing changes
    assert r.replica_of("a") == 0 and r.outstanding(0) == 1
    r.release("b")
    assert r.move("a", avoid=(1,)) is None  # the one with room is to be avoided
    assert r.move("a", avoid=()) == 1
    assert r.replica_of("a") == 1 and [r.outstanding(i) for i in range(3)] == [0, 1, 1]
    assert r.move("unknown", avoid=()) is None
    r.set_down(0)
    r.set_up(0, 1)  # a fresh start is not suspect
    assert r.assign("d") == 0


def test_moving_does_not_count_as_a_routing_decision() -> None:
    r = Router(2, "least_outstanding")
    r.set_up(0, 2)
    r.set_up(1, 2)
    r.assign("a")
    r.set_suspect(0, True)
    assert r.move("a", avoid=()) == 1
    assert sum(r.decisions.values()) == 1


def test_a_batch_flood_neither_fills_the_queue_nor_weighs_on_interactive_routing() -> None:
    r = Router(2, "least_outstanding", max_queue_per_replica=2, max_queue=3)
    r.set_up(0, 2)
    r.set_up(1, 2)
    batch = [r.assign(f"b{i}", priority=2) for i in range(7)]  # 4 slots + 3 queued: the queues are full for batch
    assert sorted([batch.count(0), batch.count(1)]) == [3, 4]
    with pytest.raises(QueueFullError):
        r.assign("b7", priority=2)
    assert r.queue_depth() == 3 and r.queue_depth(priority=0) == 0
    # not refused, and each goes where its class would not queue
    assert {r.assign("i0", priority=0), r.assign("i1", priority=0)} == {0, 1}
    r.release("i0")
    r.release("i1")
    r.release("b0")
    assert r.queue_depth() == 2 and r.ahead(0, 2) + r.ahead(1, 2) == 6 and r.ahead(0, 0) == 0


def test_a_reporting_replica_is_credited_with_what_its_engine_keeps() -> None:
    r = Router(2, "prefix")
    r.set_up(0, 4, reports=True)
    r.set_up(1, 4, reports=True)
    assert r.assign("turn1", LONG + "First question?") == 0
    keys, share = r.keys("turn1")
    assert keys == tuple(prefix_keys(LONG + "First question?")) and 0 < share <= 1  # what its Submit carries
    r.release("turn1")
    assert r.keys("turn1") == ((), 1.0)
    # its engine reported nothing kept (a tier dropped it): the next turn goes by load, not to where turn 1 went
    assert r.assign("turn2", LONG + "First question? An answer. Second question?") == 1
    r.release("turn2")
    r.held(0, HeldChange(added=keys))  # now replica 0's engine reports it holds turn 1's prefix
    assert r.assign("turn3", LONG + "First question? An answer. Third question?") == 0
    assert r.decisions == {"load": 2, "prefix": 1}
    r.set_down(0)
    r.held(0, HeldChange(added=keys))  # a late report from a replica that is down changes nothing
    r.set_up(0, 4, reports=True)
    r.release("turn3")
    assert r.assign("turn4", LONG + "First question? An answer. Fourth question?") == 1
    assert r.decisions == {"load": 3, "prefix": 1}  # the restarted replica holds nothing
