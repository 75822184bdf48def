"""Which replica runs a sequence: the routing policy and the request -> replica map.

Three policies:

* ``least_outstanding``: the replica whose in-flight sequences, counted against its slots, would be lowest after
  taking this one; ties go round-robin, so idle replicas take turns. The counts are exact, not estimates: every
  sequence passes through this router on its way in and is released when its last output (or its replica's death)
  comes back, so no stale worker stats are needed between steps.
* ``prefix`` (default): the replica whose KV holds the longest prefix of this prompt, as its engine reports it
  (:mod:`~llamafleet.fleet.affinity`; a prefix on a disk tier counts, less, for every replica that reads that tier),
  whose engine can start from that prefix's KV instead of computing it again, unless that replica is clearly busier
  than the least loaded one (:meth:`Router.clearly_busier`). A prefix shorter than :data:`MIN_PREFIX_CHARS` or a
  holder that is clearly busier falls back to ``least_outstanding``, and a tie between holders goes to the least
  loaded of them (round-robin among equals), so prompts that share nothing are routed exactly as by
  ``least_outstanding``. The margin of :data:`PREFIX_LOAD_MARGIN` (a quarter of the slots: one sequence of 4, 32 of
  128) is a choice, not a measurement: less would spread conversations that could have reused their history, more
  would let one replica run well ahead of the others while they idle. The sequences of one request (``n`` choices,
  a prompt list) are routed one after the other by the same rule: copies of a long prompt stay on the replica that got
  the first one (which computes it once for all of them) until it is clearly busier, then spread.
* ``round_robin``: each replica that is up in turn, regardless of load.

A *suspect* replica (silent past its bound, :mod:`~llamafleet.fleet.suspicion`) gets no new sequence while another
replica that can serve it has room; with none, it gets them as before (they wait for it, as they would have to anyway).
:meth:`Router.move` takes a sequence that has not started off such a replica and onto another.

Backpressure: a replica takes at most ``max_queue_per_replica`` sequences beyond its slots, and all replicas together
at most ``max_queue`` beyond theirs; past that :meth:`Router.assign` raises :class:`QueueFullError` (an HTTP 429).

Priorities (an API key's class: 0 interactive, 1 default, 2 batch; see engine/scheduler.py): a sequence counts, for
load and for the queue bounds, only the sequences of its own class and better, since the engine admits those before
it. A flood of batch work thus neither fills the queue for interactive requests nor makes a replica look busy to
them, and an interactive request goes where it would not queue. With every sequence of one class (no tenants), the
counts are the plain ones.

The map from request id to replica lets an abort reach the worker that runs the sequence, and lets a dead
replica's sequences be found and failed at once. Pure bookkeeping: no I/O, no asyncio.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from fractions import Fraction
from typing import Literal, get_args

from llamafleet.config import RoutingPolicy
from llamafleet.engine.held_keys import HeldChange
from llamafleet.engine.types import DEFAULT_PRIORITY
from llamafleet.fleet.affinity import PrefixIndex, Prompt, key_share, prefix_keys

ROUTING_POLICIES: tuple[str, ...] = get_args(RoutingPolicy)

# A shared prefix shorter than this (about 64 tokens) is not worth any imbalance: on a GPU it prefills in milliseconds.
MIN_PREFIX_CHARS = 256
# How much busier (outstanding / slots, after taking the sequence) a prefix holder may be than the least loaded replica.
PREFIX_LOAD_MARGIN = Fraction(1, 4)

Reason = Literal["prefix", "prefix_overridden_by_load", "load", "round_robin"]


class NoReplicaError(RuntimeError):
    """No replica is up to take the work."""


class QueueFullError(RuntimeError):
    """Every replica that is up has its queue full: the client should retry later."""


class Router:
    """Assigns sequences to replicas and remembers where each one runs."""

    def __init__(self, n_replicas: int, policy: RoutingPolicy = "prefix",
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
        self._classes: list[Counter[int]] = [Counter() for _ in range(n_replicas)]  # outstanding, by priority
        self._where: dict[str, int] = {}
        self._priority: dict[str, int] = {}  # of each sequence in flight
        self._suspect: set[int] = set()
        self._cursor = 0  # where the round-robin turn starts
        self._prefixes = PrefixIndex(n_replicas) if policy == "prefix" else None
        self._keys: dict[str, tuple[list[int], float]] = {}  # in flight: its prefix keys and their share
        self.decisions: Counter[Reason] = Counter()  # sequences routed, by why they went where they went

    @property
    def n_replicas(self) -> int:
        return len(self._slots)

    def outstanding(self, replica: int) -> int:
        """Sequences assigned to ``replica`` that have not finished."""
        return self._load[replica]

    def ahead(self, replica: int, priority: int | None = None) -> int:
        """Sequences on ``replica`` of class ``priority`` or better (None: all of them)."""
        if priority is None:
            return self._load[replica]
        return sum(n for p, n in self._classes[replica].items() if p <= priority)

    def queued(self, replica: int, priority: int | None = None) -> int:
        """Sequences assigned to ``replica`` beyond its slots (waiting for a slot there), counting only those of class
        ``priority`` or better (None: all)."""
        slots = self._slots[replica]
        return 0 if slots is None else max(0, self.ahead(replica, priority) - slots)

    def queue_depth(self, priority: int | None = None) -> int:
        """Sequences waiting for a slot, all replicas together (of class ``priority`` or better; None: all)."""
        return sum(self.queued(r, priority) for r in range(self.n_replicas))

    def set_up(self, replica: int, slots: int, reports: bool = False, disk_tier: str | None = None) -> None:
        """``replica`` (with ``slots`` parallel sequences) is ready for work; ``reports``: its engine reports which
        prefix keys its KV holds (:meth:`held`), and spills to the disk tier ``disk_tier`` (replicas naming the same
        one share it)."""
        if slots < 1:
            raise ValueError(f"replica {replica} reports {slots} slots; it needs at least one")
        self._slots[replica] = slots
        self._suspect.discard(replica)
        if self._prefixes is not None:
            self._prefixes.forget(replica, reports, disk_tier)  # a new engine (start or restart): its cache is empty

    def set_down(self, replica: int) -> list[str]:
        """``replica`` is gone: forget its sequences and return their ids (their callers must be told)."""
        self._slots[replica] = None
        self._suspect.discard(replica)
        lost = [rid for rid, r in self._where.items() if r == replica]
        for rid in lost:
            del self._where[rid]
        self._load[replica] = 0
        self._classes[replica].clear()
        for rid in lost:
            self._priority.pop(rid, None)
            self._keys.pop(rid, None)
        if self._prefixes is not None:
            self._prefixes.forget(replica)
        return lost

    def held(self, replica: int, change: HeldChange) -> None:
        """``replica``'s engine reports the prefix keys its KV gained and lost."""
        if self._prefixes is not None and self._slots[replica] is not None:
            self._prefixes.update(replica, change)

    def keys(self, request_id: str) -> tuple[tuple[int, ...], float]:
        """The prefix keys of ``request_id``'s prompt (in flight) and the share of its text they cover, for its
        engine to report on (none without prefix routing)."""
        keys, share = self._keys.get(request_id, ([], 1.0))
        return tuple(keys), share

    def set_suspect(self, replica: int, suspect: bool) -> None:
        """``replica`` is suspect (no new work while another can take it) or no longer."""
        (self._suspect.add if suspect else self._suspect.discard)(replica)

    def suspects(self) -> list[int]:
        return sorted(self._suspect)

    def assign(self, request_id: str, prompt: Prompt = "", able: Collection[int] | None = None,
               priority: int = DEFAULT_PRIORITY) -> int:
        """Choose a replica for ``request_id`` (whose ``prompt`` is text or chat messages, of class ``priority``) and
        record it there; ``able``: the only replicas that can serve it (None: any)."""
        if request_id in self._where:
            raise ValueError(f"request id {request_id!r} is already in flight")
        up = [r for r in self._rotation() if able is None or r in able]
        if not up:
            raise NoReplicaError("no replica is ready to serve (loading or restarting)" if able is None else
                                 "no replica that can serve this request is ready (loading or restarting)")
        candidates = [r for r in up if self._has_room(r, priority)]
        if not candidates:
            raise QueueFullError(f"the server is at capacity ({self.queue_depth(priority)} sequence(s) already "
                                 "waiting)")
        if self._prefixes is not None:
            keys = prefix_keys(prompt)
            self._keys[request_id] = (keys, key_share(prompt, keys))
        chosen, reason = self._choose([r for r in candidates if r not in self._suspect] or candidates,
                                      self._keys.get(request_id, ([], 1.0))[0], priority)
        self.decisions[reason] += 1
        self._place(request_id, chosen, priority)
        return chosen

    def move(self, request_id: str, avoid: Collection[int]) -> int | None:
        """Put ``request_id`` (not started on its replica) on another replica that is up, not suspect, not in
        ``avoid`` and has room, as :meth:`assign` would choose it; None (nothing changes) if there is none."""
        source = self._where.get(request_id)
        priority = self._priority.get(request_id, DEFAULT_PRIORITY)
        options = [r for r in self._rotation() if r != source and r not in avoid and r not in self._suspect
                   and self._has_room(r, priority)]
        if source is None or not options:
            return None
        chosen, _ = self._choose(options, self._keys.get(request_id, ([], 1.0))[0], priority)
        self._forget(request_id, source)
        self._place(request_id, chosen, priority)
        return chosen

    def _place(self, request_id: str, chosen: int, priority: int) -> None:
        if self._prefixes is not None and request_id in self._keys:
            self._prefixes.record(chosen, self._keys[request_id][0])
        self._cursor = (chosen + 1) % self.n_replicas
        self._where[request_id] = chosen
        self._priority[request_id] = priority
        self._load[chosen] += 1
        self._classes[chosen][priority] += 1

    def _forget(self, request_id: str, replica: int) -> None:
        if self._prefixes is not None and request_id in self._keys:
            self._prefixes.done(replica, self._keys[request_id][0])
        self._load[replica] -= 1
        self._classes[replica][self._priority.pop(request_id, DEFAULT_PRIORITY)] -= 1

    def release(self, request_id: str) -> int | None:
        """``request_id`` finished; returns the replica it ran on (None if unknown, e.g. its replica died)."""
        replica = self._where.pop(request_id, None)
        if replica is not None:
            self._forget(request_id, replica)
        self._keys.pop(request_id, None)
        return replica

    def replica_of(self, request_id: str) -> int | None:
        return self._where.get(request_id)

    def clearly_busier(self, holder: int, least: int, priority: int = DEFAULT_PRIORITY) -> bool:
        """Whether a prefix ``holder`` is too busy, next to the ``least`` loaded replica, to take the sequence there:
        on the holder it would wait for a slot while the least loaded has one free, or the holder's outstanding /
        slots after taking it would exceed the least loaded's by more than :data:`PREFIX_LOAD_MARGIN`."""
        holder_slots, least_slots = self._slots[holder], self._slots[least]
        assert holder_slots is not None and least_slots is not None
        if self.ahead(holder, priority) >= holder_slots and self.ahead(least, priority) < least_slots:
            return True
        return (self._score_after_one_more(holder, priority) - self._score_after_one_more(least, priority)
                > PREFIX_LOAD_MARGIN)

    def _choose(self, candidates: list[int], keys: list[int], priority: int) -> tuple[int, Reason]:
        """The replica for a sequence (whose prompt has these prefix ``keys``) among ``candidates`` (up, with room,
        in rotation order), and why."""
        if self.policy == "round_robin":
            return candidates[0], "round_robin"
        # min() keeps the first of equals, so ties follow the rotation
        least = min(candidates, key=lambda r: self._score_after_one_more(r, priority))
        if self._prefixes is None:
            return least, "load"
        matched = self._prefixes.match(keys)
        longest = max(matched.get(r, 0) for r in candidates)
        chosen: int
        reason: Reason
        if longest < MIN_PREFIX_CHARS:
            chosen, reason = least, "load"
        else:
            holder = min((r for r in candidates if matched.get(r, 0) == longest),
                         key=lambda r: self._score_after_one_more(r, priority))
            chosen, reason = ((least, "prefix_overridden_by_load") if self.clearly_busier(holder, least, priority)
                              else (holder, "prefix"))
        return chosen, reason

    def _rotation(self) -> list[int]:
        """Up replicas, starting at the round-robin cursor."""
        n = self.n_replicas
        order = [(self._cursor + i) % n for i in range(n)]
        return [r for r in order if self._slots[r] is not None]

    def _has_room(self, replica: int, priority: int) -> bool:
        """Whether one more sequence of class ``priority`` on ``replica`` stays within the queue limits."""
        slots = self._slots[replica]
        assert slots is not None
        if self.ahead(replica, priority) < slots:
            return True  # a free slot, or one that frees for it before the worse classes waiting there
        if self.max_queue_per_replica is not None and self.queued(replica, priority) >= self.max_queue_per_replica:
            return False
        return self.max_queue is None or self.queue_depth(priority) < self.max_queue

    def _score_after_one_more(self, replica: int, priority: int) -> Fraction:
        slots = self._slots[replica]
        assert slots is not None
        return Fraction(self.ahead(replica, priority) + 1, slots)
