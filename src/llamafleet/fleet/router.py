"""Which replica runs a sequence: the routing policy and the request -> replica map.

Two policies:

* ``least_outstanding`` (default): the replica whose in-flight sequences, counted against its slots, would be
  lowest after taking this one; ties go round-robin, so idle replicas take turns. The counts are exact, not
  estimates: every sequence passes through this router on its way in and is released when its last output (or its
  replica's death) comes back, so no stale worker stats are needed between steps.
* ``round_robin``: the seed's policy, each replica that is up in turn, regardless of load.

Backpressure: a replica takes at most ``max_queue_per_replica`` sequences beyond its slots, and all replicas together
at most ``max_queue`` beyond theirs; past that :meth:`Router.assign` raises :class:`QueueFullError` (an HTTP 429).

The map from request id to replica lets an abort reach the worker that runs the sequence, and lets a dead
replica's sequences be found and failed at once. Pure bookkeeping: no I/O, no asyncio.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Literal, get_args

RoutingPolicy = Literal["least_outstanding", "round_robin"]
ROUTING_POLICIES: tuple[str, ...] = get_args(RoutingPolicy)


class NoReplicaError(RuntimeError):
    """No replica is up to take the work."""


class QueueFullError(RuntimeError):
    """Every replica that is up has its queue full: the client should retry later."""


class Router:
    """Assigns sequences to replicas and remembers where each one runs."""

    def __init__(self, n_replicas: int, policy: RoutingPolicy = "least_outstanding",
                 max_queue_per_replica: int | None = None, max_queue: int | None = None) -> None:
        if n_replicas < 1:
            raise ValueError("a router needs at least one replica")
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; use one of {', '.join(ROUTING_POLICIES)}")
        self.policy = policy
        self.max_queue_per_replica = max_queue_per_replica  # None: unbounded
        self.max_queue = max_queue
        self._slots: list[int | None] = [None] * n_replicas  # None: the replica is down
        self._load = [0] * n_replicas
        self._where: dict[str, int] = {}
        self._cursor = 0  # where the round-robin turn starts

    @property
    def n_replicas(self) -> int:
        return len(self._slots)

    def up(self) -> list[int]:
        """The replicas that can take work now."""
        return [r for r, slots in enumerate(self._slots) if slots is not None]

    def outstanding(self, replica: int) -> int:
        """Sequences assigned to ``replica`` that have not finished."""
        return self._load[replica]

    def queued(self, replica: int) -> int:
        """Sequences assigned to ``replica`` beyond its slots (waiting for a slot there)."""
        slots = self._slots[replica]
        return 0 if slots is None else max(0, self._load[replica] - slots)

    def queue_depth(self) -> int:
        """Sequences waiting for a slot, all replicas together."""
        return sum(self.queued(r) for r in range(self.n_replicas))

    def set_up(self, replica: int, slots: int) -> None:
        """``replica`` (with ``slots`` parallel sequences) is ready for work."""
        if slots < 1:
            raise ValueError(f"replica {replica} reports {slots} slots; it needs at least one")
        self._slots[replica] = slots

    def set_down(self, replica: int) -> list[str]:
        """``replica`` is gone: forget its sequences and return their ids (their callers must be told)."""
        self._slots[replica] = None
        lost = [rid for rid, r in self._where.items() if r == replica]
        for rid in lost:
            del self._where[rid]
        self._load[replica] = 0
        return lost

    def assign(self, request_id: str) -> int:
        """Choose a replica for ``request_id`` and record it there."""
        if request_id in self._where:
            raise ValueError(f"request id {request_id!r} is already in flight")
        up = self._rotation()
        if not up:
            raise NoReplicaError("no replica is ready to serve (loading or restarting)")
        candidates = [r for r in up if self._has_room(r)]
        if not candidates:
            raise QueueFullError(f"the server is at capacity ({self.queue_depth()} sequence(s) already waiting)")
        # min() keeps the first of equals, so ties follow the rotation
        chosen = candidates[0] if self.policy == "round_robin" else min(candidates, key=self._score_after_one_more)
        self._cursor = (chosen + 1) % self.n_replicas
        self._where[request_id] = chosen
        self._load[chosen] += 1
        return chosen

    def release(self, request_id: str) -> int | None:
        """``request_id`` finished; returns the replica it ran on (None if unknown, e.g. its replica died)."""
        replica = self._where.pop(request_id, None)
        if replica is not None:
            self._load[replica] -= 1
        return replica

    def replica_of(self, request_id: str) -> int | None:
        return self._where.get(request_id)

    def _rotation(self) -> list[int]:
        """Up replicas, starting at the round-robin cursor."""
        n = self.n_replicas
        order = [(self._cursor + i) % n for i in range(n)]
        return [r for r in order if self._slots[r] is not None]

    def _has_room(self, replica: int) -> bool:
        """Whether one more sequence on ``replica`` stays within the queue limits."""
        slots = self._slots[replica]
        assert slots is not None
        if self._load[replica] < slots:
            return True  # a free slot: nothing waits
        if self.max_queue_per_replica is not None and self.queued(replica) >= self.max_queue_per_replica:
            return False
        return self.max_queue is None or self.queue_depth() < self.max_queue

    def _score_after_one_more(self, replica: int) -> Fraction:
        slots = self._slots[replica]
        assert slots is not None
        return Fraction(self._load[replica] + 1, slots)
