"""The dispatcher: fans a request's sequences out to replicas and brings their outputs back, in the event loop.

An HTTP request becomes a :class:`Group` of sequences (``n`` choices x prompts); each sequence is routed on its own
(:mod:`llamafleet.router`), so one request's choices spread over replicas. Worker messages arrive once per engine
step per replica; the dispatcher hands each output to its group's queue tagged with the sequence's index in the
group, so handlers aggregate in input order however the replicas interleave.

Every sequence ends with exactly one final event: its last output, or a :class:`Failure` (rejected by the worker,
its replica died, the server is stopping). Closing a group early (client gone) aborts its unfinished sequences on
the replicas that run them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from llamafleet.engine.types import RequestOutput
from llamafleet.messages import Abort, Ready, StepOutputs, Submit
from llamafleet.replicas import ReplicaSet
from llamafleet.router import Router

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delta:
    """New output of one sequence; ``pieces`` (text of each token) only when logprobs were asked for."""

    output: RequestOutput
    pieces: list[str] | None


@dataclass(frozen=True)
class Failure:
    """A sequence that ended without an answer; ``status`` is the HTTP status that fits."""

    status: int
    message: str


Event = tuple[int, Delta | Failure]  # (index of the sequence in its group, what happened)


class Group:
    """The sequences of one HTTP request; their events arrive on one queue. Use :meth:`next` until :attr:`finished`."""

    def __init__(self, dispatcher: Dispatcher, request_ids: list[str], replicas: list[int]) -> None:
        self.request_ids = request_ids
        self.replicas = replicas  # where each sequence was sent
        self._dispatcher = dispatcher
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._remaining = len(request_ids)

    @property
    def finished(self) -> bool:
        """Every sequence's final event has been taken."""
        return self._remaining == 0

    async def next(self) -> Event:
        index, item = await self._queue.get()
        if isinstance(item, Failure) or item.output.finished:
            self._remaining -= 1
        return index, item

    def put(self, index: int, item: Delta | Failure) -> None:
        self._queue.put_nowait((index, item))

    def close(self) -> None:
        """Stop listening; sequences still running are aborted. Safe to call more than once."""
        self._dispatcher.close(self)


class Dispatcher:
    """Routes sequences to replicas and their outputs back to groups; the replica set's listener."""

    def __init__(self, replicas: ReplicaSet, router: Router) -> None:
        if router.n_replicas != len(replicas):
            raise ValueError(f"router has {router.n_replicas} replicas, replica set {len(replicas)}")
        self.replicas = replicas
        self.router = router
        self._routes: dict[str, tuple[Group, int]] = {}

    async def start(self) -> None:
        """Load the replicas (serially); see :meth:`ReplicaSet.start`."""
        await self.replicas.start(self)

    def submit(self, msgs: list[Submit]) -> Group:
        """Send every sequence of one request to a replica. :class:`~llamafleet.router.NoReplicaError` if none is up."""
        try:
            placed = [self.router.assign(m.request_id) for m in msgs]
        except BaseException:
            for m in msgs:
                self.router.release(m.request_id)
            raise
        group = Group(self, [m.request_id for m in msgs], placed)
        for index, m in enumerate(msgs):
            self._routes[m.request_id] = (group, index)
        # Routes first: a pipe found dead while sending reports its replica down, which fails all of its sequences
        for replica, m in zip(placed, msgs, strict=True):
            self.replicas.send(replica, m)
        return group

    def close(self, group: Group) -> None:
        for rid in group.request_ids:
            if self._routes.pop(rid, None) is None:
                continue  # already finished
            replica = self.router.replica_of(rid)
            if replica is not None:
                self.replicas.send(replica, Abort(rid))  # released when its "cancelled" output comes back

    # -- ReplicaListener ----------------------------------------------------------------------------------------
    def replica_up(self, replica: int, ready: Ready) -> None:
        self.router.set_up(replica, ready.n_seq)

    def replica_down(self, replica: int, reason: str) -> None:
        lost = self.router.set_down(replica)
        if lost:
            log.error("%d sequence(s) lost with replica %d", len(lost), replica)
        for rid in lost:
            self._deliver(rid, Failure(503, f"{reason}, while running this request; retry it"), final=True)

    def replica_output(self, replica: int, msg: StepOutputs) -> None:
        for rej in msg.rejected:
            self.router.release(rej.request_id)
            self._deliver(rej.request_id, Failure(400 if rej.client_error else 500, rej.message), final=True)
        for out in msg.outputs:
            rid = out.request_id
            if out.finished:
                self.router.release(rid)
            item: Delta | Failure
            if out.finish_reason == "error":
                item = Failure(500, out.error or "generation failed on the replica")
            elif out.finish_reason == "cancelled":  # not asked for by a client (its group would be closed)
                item = Failure(503, "the request was cancelled because the server is shutting down")
            else:
                item = Delta(out, msg.pieces.get(rid))
            self._deliver(rid, item, final=out.finished)

    def _deliver(self, rid: str, item: Delta | Failure, final: bool) -> None:
        route = self._routes.pop(rid, None) if final else self._routes.get(rid)
        if route is not None:
            group, index = route
            group.put(index, item)
