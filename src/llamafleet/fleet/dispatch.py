"""The dispatcher: fans a request's sequences out to replicas and brings their outputs back, in the event loop.

An HTTP request becomes a :class:`Group` of sequences (``n`` choices x prompts); each sequence is routed on its own
(:mod:`llamafleet.fleet.router`), so one request's choices spread over replicas. Worker messages arrive once per engine
step per replica; the dispatcher hands each output to its group's queue tagged with the sequence's index in the
group, so handlers aggregate in input order however the replicas interleave.

A sequence that has not started (no output yet) on a replica that becomes suspect
(:mod:`llamafleet.fleet.suspicion`) is moved: aborted there and sent to another replica, never back to one it left.
Whatever the suspect replica still says of it later (the abort's "cancelled", or tokens of a step it was frozen in) is
ignored, so it runs once for its client and leaves no slot behind. Sequences already streaming stay where they are.

Every sequence ends with exactly one final event: its last output, or a :class:`Failure` (rejected by the worker,
its replica died, the server is stopping, the request ran past its timeout). Closing a group early (client gone)
aborts its unfinished sequences on the replicas that run them.

The dispatcher also times every sequence (submitted -> first token, gaps between tokens) and counts its tokens and
how it ended, into :class:`~llamafleet.fleet.telemetry.FleetMetrics`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from llamafleet.engine.types import ContextOverflow, RequestOutput
from llamafleet.fleet.messages import Abort, Ready, StepOutputs, Submit
from llamafleet.fleet.replicas import ReplicaSet
from llamafleet.fleet.router import Router
from llamafleet.fleet.telemetry import FleetMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delta:
    """New output of one sequence; ``pieces`` (text of each token) only when logprobs were asked for."""

    output: RequestOutput
    pieces: list[bytes] | None


@dataclass(frozen=True)
class Failure:
    """A sequence that ended without an answer; ``status`` is the HTTP status that fits (``overflow``: the numbers of
    a prompt too long for the context)."""

    status: int
    message: str
    overflow: ContextOverflow | None = None


class Unservable(ValueError):
    """No replica of the model can serve the request as asked (a 400: the client must ask differently)."""


Event = tuple[int, Delta | Failure]  # (index of the sequence in its group, what happened)
Meter = Callable[[int, int, int], None]  # a request's tokens as they come: (prompt, of them cached, new completion)


@dataclass
class _Route:
    """Where a sequence's events go, its timing so far, and what moving it needs until it starts."""

    group: Group
    index: int
    submitted: float  # time.perf_counter()
    msg: Submit | None  # until its first output: what to send to another replica if it moves
    able: list[int] | None  # the replicas that can serve it (None: all)
    left: list[int] = field(default_factory=list)  # replicas it was moved off
    last_token: float | None = None
    metered: int = -1  # completion tokens already metered (-1: not even its prompt yet)


class Group:
    """The sequences of one HTTP request; their events arrive on one queue. Use :meth:`next` until :attr:`finished`."""

    def __init__(self, dispatcher: Dispatcher, request_ids: list[str], replicas: list[int],
                 timeout_s: float | None = None, meter: Meter | None = None) -> None:
        self.request_ids = request_ids
        self.meter = meter
        self.replicas = replicas  # where each sequence was sent
        self._dispatcher = dispatcher
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._remaining = len(request_ids)
        self._timeout_s = timeout_s
        self._deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
        self.timed_out = False

    @property
    def finished(self) -> bool:
        """Every sequence's final event has been taken."""
        return self._remaining == 0

    async def next(self) -> Event:
        """The next event; past the request's timeout, a final 504 :class:`Failure` (then close the group)."""
        if self._deadline is None:
            return self._count(*await self._queue.get())
        try:
            async with asyncio.timeout_at(self._deadline):
                index, item = await self._queue.get()
        except TimeoutError:
            self._remaining = 0
            self.timed_out = True  # its sequences still running are counted as "timeout" when their abort lands
            return 0, Failure(504, f"the request did not finish within {self._timeout_s:g}s (the server's "
                                   "request_timeout_s); ask for fewer tokens or retry when the server is less busy")
        return self._count(index, item)

    def ready(self) -> list[Event]:
        """Every event already queued, without waiting (a stream writes them together: one send, not many)."""
        events: list[Event] = []
        while self._remaining and not self._queue.empty():
            events.append(self._count(*self._queue.get_nowait()))
        return events

    def _count(self, index: int, item: Delta | Failure) -> Event:
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

    def __init__(self, replicas: ReplicaSet, router: Router, metrics: FleetMetrics | None = None,
                 model: str = "", replica_prefix: str = "") -> None:
        if router.n_replicas != len(replicas):
            raise ValueError(f"router has {router.n_replicas} replicas, replica set {len(replicas)}")
        self.replicas = replicas
        self.router = router
        self.metrics = metrics or FleetMetrics()
        self.model = model  # set: its requests, tokens and first-token times are also counted under this label
        self.replica_prefix = replica_prefix  # of its replicas' metric labels: "" for a lone model, "chat/" for several
        self._routes: dict[str, _Route] = {}
        self._timed_out: set[str] = set()  # aborted for the request's timeout: counted as "timeout", not "cancelled"
        self.family: str | None = None  # the model's family, as its replicas recognised it (see Ready)
        self.reranker = False  # its replicas said it is a reranker (see Ready)

    async def start(self) -> None:
        """Load the replicas (serially); see :meth:`ReplicaSet.start`."""
        await self.replicas.start(self)

    def submit(self, msgs: list[Submit], timeout_s: float | None = None, meter: Meter | None = None) -> Group:
        """Send every sequence of one request to a replica; its events stop after ``timeout_s``; ``meter`` is told
        the tokens each sequence uses, as they come.

        :class:`~llamafleet.fleet.router.NoReplicaError` if none is up, :class:`~llamafleet.fleet.router.QueueFullError`
        if the queues are full (then nothing was sent)."""
        able = [self._able(m) for m in msgs]  # before anything is assigned: a refusal leaves nothing behind
        try:
            placed = [self.router.assign(m.request_id, m.routing_prompt, a, m.priority)
                      for m, a in zip(msgs, able, strict=True)]
        except BaseException:
            for m in msgs:
                self.router.release(m.request_id)
            raise
        if self.model:
            self.metrics.model_requests.inc(self.model)
        msgs = [self._keyed(m) for m in msgs]
        group = Group(self, [m.request_id for m in msgs], placed, timeout_s, meter)
        now = time.perf_counter()
        for index, (m, a) in enumerate(zip(msgs, able, strict=True)):
            self._routes[m.request_id] = _Route(group, index, now, msg=m, able=a)
        # Routes first: a replica found gone while sending is reported down, which fails all of its sequences
        for replica, m in zip(placed, msgs, strict=True):
            self.replicas.send(replica, m)
        return group

    def _keyed(self, msg: Submit) -> Submit:
        """``msg`` with its prompt's prefix keys, for its engine to report which of them its KV holds."""
        keys, share = self.router.keys(msg.request_id)
        return replace(msg, prefix_keys=keys, prefix_share=share) if keys else msg

    def _able(self, msg: Submit) -> list[int] | None:
        """The replicas that can serve ``msg`` (None: all); :class:`Unservable` if none can (remote members
        cannot serve everything: a spec's ``refuses``, see :func:`~llamafleet.fleet.remote.unrelayable`)."""
        why = {i: s.refuses(msg) for i, s in enumerate(self.replicas.specs) if s.refuses is not None}
        if not any(why.values()):
            return None
        able = [i for i in range(len(self.replicas)) if not why.get(i)]
        if not able:
            raise Unservable(f"this model is served by remote members only, and {next(w for w in why.values() if w)}")
        return able

    def close(self, group: Group) -> None:
        for rid in group.request_ids:
            if self._routes.pop(rid, None) is None:
                continue  # already finished
            if self._abort(rid) and group.timed_out:
                self._timed_out.add(rid)

    def abort_all(self, message: str) -> int:
        """End every running sequence now with a 503 ``message`` (the server must stop); returns how many."""
        rids = list(self._routes)
        for rid in rids:
            self._abort(rid)
            self._deliver(rid, Failure(503, message), final=True)
        return len(rids)

    def _abort(self, rid: str) -> bool:
        """Tell the replica running ``rid`` to stop it (it is released when its "cancelled" output comes back)."""
        replica = self.router.replica_of(rid)
        if replica is not None:
            self.replicas.send(replica, Abort(rid))
        return replica is not None

    # -- ReplicaListener ----------------------------------------------------------------------------------------
    def replica_up(self, replica: int, ready: Ready) -> None:
        self.router.set_up(replica, ready.n_seq, ready.reports_held, ready.disk_tier)
        self.family, self.reranker = ready.family, ready.reranker

    def replica_suspect(self, replica: int, suspect: bool) -> None:
        """``replica`` fell silent past its bound (or spoke again): route around it, and move what has not started."""
        self.router.set_suspect(replica, suspect)
        if suspect:
            self._move_off(replica)

    def _move_off(self, replica: int) -> None:
        """Move ``replica``'s sequences that have not started to other replicas with room (see the module
        docstring); those that find none stay, and are tried again when a sequence ends elsewhere."""
        moved = 0
        for rid, route in list(self._routes.items()):  # oldest first
            if route.msg is None or self.router.replica_of(rid) != replica:
                continue
            avoid = [*route.left, *(r for r in range(len(self.replicas)) if route.able is not None
                                    and r not in route.able)]
            target = self.router.move(rid, avoid)
            if target is None:
                continue
            route.left.append(replica)
            self.replicas.send(replica, Abort(rid))  # if it ever wakes up: nothing runs twice, no slot stays taken
            self.replicas.send(target, route.msg)
            route.group.replicas[route.index] = target
            moved += 1
        if moved:
            self.metrics.moved.inc(amount=moved)
            log.warning("moved %d sequence(s) that had not started off suspect replica %s%d", moved,
                        self.replica_prefix, replica)

    def replica_down(self, replica: int, reason: str) -> None:
        lost = self.router.set_down(replica)
        if lost:
            log.error("%d sequence(s) lost with replica %d", len(lost), replica)
        for rid in lost:
            self.metrics.sequences.inc("timeout" if rid in self._timed_out else "lost")
            self._timed_out.discard(rid)
            self._deliver(rid, Failure(503, f"{reason}, while running this request; retry it"), final=True)

    def replica_output(self, replica: int, msg: StepOutputs) -> None:
        if msg.held is not None:  # before the outputs: a sequence that ends counts by what its KV kept from now on
            self.router.held(replica, msg.held)
        mine = self.router.replica_of  # a sequence moved off this replica is no longer its business
        for rej in msg.rejected:
            if mine(rej.request_id) != replica:
                continue
            self.router.release(rej.request_id)
            self.metrics.sequences.inc("rejected")
            self._deliver(rej.request_id, Failure(rej.status, rej.message, rej.overflow), final=True)
        ended = bool(msg.rejected)
        for out in msg.outputs:
            rid = out.request_id
            if mine(rid) != replica:
                continue
            self._observe(replica, out)
            if out.finished:
                ended = True
                self.router.release(rid)
            item: Delta | Failure
            if out.finish_reason == "error":
                item = Failure(500, out.error or "generation failed on the replica")
            elif out.finish_reason == "cancelled":  # not asked for by a client (its group would be closed)
                item = Failure(503, "the request was cancelled because the server is shutting down")
            else:
                item = Delta(out, msg.pieces.get(rid))
            self._deliver(rid, item, final=out.finished)
        for suspect in self.router.suspects() if ended else ():  # room may have come free for what waits there
            self._move_off(suspect)

    def _observe(self, replica: int, out: RequestOutput) -> None:
        """Time the sequence's new tokens (by the replica that made them); count its tokens and outcome when it ends."""
        if out.prompt_ids is not None:  # a request only tokenized: nothing was computed or generated
            return
        route = self._routes.get(out.request_id)
        ranked = route is not None and route.msg is not None and route.msg.rerank is not None
        if route is not None:
            route.msg = None  # started: it stays where it is
            if route.group.meter is not None:
                prompt = (out.prompt_tokens, out.cached_tokens) if route.metered < 0 else (0, 0)
                route.group.meter(*prompt, out.completion_tokens - max(route.metered, 0))
                route.metered = out.completion_tokens
        if route is not None and out.token_ids:
            now = time.perf_counter()
            label = f"{self.replica_prefix}{replica}"
            if route.last_token is None:
                self.metrics.ttft.observe(now - route.submitted, label)
                if self.model:
                    self.metrics.model_ttft.observe(now - route.submitted, self.model)
            else:
                self.metrics.token_gap.observe((now - route.last_token) / len(out.token_ids), label)
            route.last_token = now
        if out.finished:
            timed_out = out.request_id in self._timed_out
            self._timed_out.discard(out.request_id)
            if out.embeddings is not None:  # an embedding or rerank request's whole answer: not a generated sequence
                inputs, tokens = ((self.metrics.ranked_pairs, self.metrics.ranked_tokens) if ranked
                                  else (self.metrics.embedded_inputs, self.metrics.embedded_tokens))
                inputs.inc(amount=len(out.embeddings))
                tokens.inc(amount=out.prompt_tokens)
                return
            self.metrics.sequences.inc("timeout" if timed_out and out.finish_reason == "cancelled"
                                       else out.finish_reason or "unknown")
            self.metrics.prompt_tokens.inc(amount=out.prompt_tokens)
            self.metrics.prompt_cached.inc(amount=out.cached_tokens)
            self.metrics.prompt_computed.inc(amount=out.prompt_tokens - out.cached_tokens)
            self.metrics.generated_tokens.inc(amount=out.completion_tokens)
            self.metrics.draft_tokens.inc(amount=out.drafted_tokens)
            self.metrics.draft_accepted.inc(amount=out.accepted_tokens)
            self.metrics.draft_rejected.inc(amount=out.drafted_tokens - out.accepted_tokens)
            if self.model:
                self.metrics.model_prompt_tokens.inc(self.model, amount=out.prompt_tokens)
                self.metrics.model_generated_tokens.inc(self.model, amount=out.completion_tokens)

    def _deliver(self, rid: str, item: Delta | Failure, final: bool) -> None:
        route = self._routes.pop(rid, None) if final else self._routes.get(rid)
        if route is not None:
            route.group.put(route.index, item)
