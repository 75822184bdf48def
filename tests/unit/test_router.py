"""The router: least outstanding work with round-robin ties, the seed's round robin, and the request map."""

from __future__ import annotations

import pytest

from llamafleet.fleet.router import NoReplicaError, Router


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
    assert r.up() == [0]
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
