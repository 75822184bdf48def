"""Fan-out and fan-in without worker processes: the dispatcher and the aggregation over a replica set that only
records what it is sent.

The process layer (spawn, pipes, restarts) has its own tests against real workers (tests/integration); here every
ordering that is hard to provoke with real processes is written down: a replica that breaks in the middle of a
submit, rejections, timeouts, aborts, and a stream that fails half-way.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from starlette.requests import Request

from llamafleet.api.aggregate import respond
from llamafleet.api.openai import ChatRenderer, TextRenderer
from llamafleet.engine.types import EngineConfig, EngineStats, RequestOutput, SamplingParams
from llamafleet.fleet.dispatch import Delta, Dispatcher, Failure, Group
from llamafleet.fleet.launch import ReplicaSpec
from llamafleet.fleet.messages import Abort, Ready, Rejected, StepOutputs, Submit, ToWorker
from llamafleet.fleet.replicas import ReplicaListener
from llamafleet.fleet.router import NoReplicaError, QueueFullError, Router

STATS = EngineStats(slots_total=4, slots_busy=0, waiting=0, kv_tokens_used=0, kv_tokens_total=0, steps=0,
                    prompt_tokens_total=0, generated_tokens_total=0, decode_seconds_total=0.0, step_seconds_total=0.0,
                    sample_seconds_total=0.0)


class Replicas:
    """Stands where the worker processes would: records every message; a replica in ``broken`` fails its next
    send the way a real one does (reported down to the listener at once, inside the send)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.sent: list[tuple[int, ToWorker]] = []
        self.broken: set[int] = set()
        self.down: set[int] = set()
        self.listener: ReplicaListener | None = None
        # local replicas: they serve anything
        self.specs = [ReplicaSpec(env={}, engine=EngineConfig("model.gguf"), label="CPU")] * n

    def __len__(self) -> int:
        return self.n

    async def start(self, listener: ReplicaListener) -> None:
        self.listener = listener
        for i in range(self.n):
            listener.replica_up(i, Ready(pid=1000 + i, n_seq=4, n_ctx_per_seq=512, load_seconds=0.0))

    def send(self, replica: int, msg: ToWorker) -> None:
        assert self.listener is not None
        if replica in self.broken or replica in self.down:
            self.broken.discard(replica)
            self.down.add(replica)
            self.listener.replica_down(replica, f"replica {replica} worker stopped: its pipe broke")
            return
        self.sent.append((replica, msg))

    def submitted(self, replica: int) -> list[str]:
        return [m.request_id for r, m in self.sent if r == replica and isinstance(m, Submit)]

    def aborted(self) -> list[str]:
        return [m.request_id for _, m in self.sent if isinstance(m, Abort)]


def run(test: Callable[[Dispatcher, Replicas], Coroutine[Any, Any, None]], n_replicas: int = 2,
        router: Router | None = None) -> None:
    async def main() -> None:
        replicas = Replicas(n_replicas)
        dispatcher = Dispatcher(replicas, router or Router(n_replicas))  # type: ignore[arg-type]
        await dispatcher.start()
        await test(dispatcher, replicas)

    asyncio.run(main())


def submits(prefix: str, n: int) -> list[Submit]:
    return [Submit(f"{prefix}-{i}", SamplingParams(max_tokens=4), prompt="hi") for i in range(n)]


def output(rid: str, text: str, finished: bool = False, reason: str | None = None) -> RequestOutput:
    return RequestOutput(rid, text=text, token_ids=[7] * len(text), finished=finished,
                         finish_reason=reason,  # type: ignore[arg-type]
                         prompt_tokens=3, completion_tokens=len(text), cached_tokens=2)


def step(*outputs: RequestOutput, rejected: tuple[Rejected, ...] = ()) -> StepOutputs:
    return StepOutputs(outputs=list(outputs), rejected=list(rejected), pieces={}, stats=STATS)


async def drain(group: Group) -> list[tuple[int, Delta | Failure]]:
    """Every event of ``group``; a sequence whose final event never comes fails the test instead of hanging it."""
    events = []
    async with asyncio.timeout(5):
        while not group.finished:
            events.append(await group.next())
    return events


def test_sequences_spread_over_replicas_and_come_back_in_their_own_slots() -> None:
    async def test(d: Dispatcher, reps: Replicas) -> None:
        group = d.submit(submits("r", 4))
        assert group.replicas == [0, 1, 0, 1]
        assert reps.submitted(0) == ["r-0", "r-2"] and reps.submitted(1) == ["r-1", "r-3"]
        d.replica_output(1, step(output("r-3", "b", True, "stop"), output("r-1", "a", True, "length")))
        d.replica_output(0, step(output("r-2", "d", True, "stop"), output("r-0", "c", True, "stop")))
        events = await drain(group)
        assert sorted((i, e.output.text) for i, e in events if isinstance(e, Delta)) == [
            (0, "c"), (1, "a"), (2, "d"), (3, "b")]
        assert [d.router.outstanding(r) for r in (0, 1)] == [0, 0]

    run(test)


def test_a_replica_that_breaks_in_the_middle_of_a_submit_fails_only_its_own_sequences() -> None:
    """The first send to replica 1 finds its pipe broken: replica_down runs inside submit, before the later sends.
    Sequences already routed to replica 1 fail once each with 503; the others run; no count is left behind."""
    async def test(d: Dispatcher, reps: Replicas) -> None:
        reps.broken.add(1)
        group = d.submit(submits("m", 4))
        assert reps.submitted(0) == ["m-0", "m-2"] and reps.submitted(1) == []
        d.replica_output(0, step(output("m-0", "x", True, "stop"), output("m-2", "y", True, "stop")))
        events = await drain(group)
        failures = {i: e for i, e in events if isinstance(e, Failure)}
        assert sorted(failures) == [1, 3] and all(f.status == 503 for f in failures.values())
        assert "retry" in failures[1].message
        assert len(events) == 4  # one final event per sequence, none twice
        assert [d.router.outstanding(r) for r in (0, 1)] == [0, 0]
        with pytest.raises(NoReplicaError):  # replica 1 is down, not merely full
            d.router.assign("only-1", able=[1])
        later = d.submit(submits("n", 2))  # new work goes to the replica that is still up
        assert later.replicas == [0, 0]

    run(test)


def test_a_rejected_sequence_fails_with_the_workers_status_and_frees_its_place() -> None:
    async def test(d: Dispatcher, reps: Replicas) -> None:
        group = d.submit(submits("j", 1))
        d.replica_output(0, step(rejected=(Rejected("j-0", "prompt too long", 400),)))
        [(index, event)] = await drain(group)
        assert index == 0 and event == Failure(400, "prompt too long")
        assert d.router.outstanding(0) == 0

    run(test)


def test_full_queues_send_nothing_and_keep_no_count() -> None:
    async def test(d: Dispatcher, reps: Replicas) -> None:
        d.submit(submits("a", 4))  # the only replica's 4 slots
        with pytest.raises(QueueFullError):
            d.submit(submits("b", 2))  # one more would queue, and the queue bound is 0
        assert reps.submitted(0) == ["a-0", "a-1", "a-2", "a-3"]
        assert d.router.outstanding(0) == 4

    run(test, n_replicas=1, router=Router(1, max_queue_per_replica=0))


def test_closing_a_group_aborts_what_runs_and_drops_its_late_outputs() -> None:
    async def test(d: Dispatcher, reps: Replicas) -> None:
        group = d.submit(submits("c", 2))
        d.replica_output(0, step(output("c-0", "done", True, "stop")))
        group.close()
        assert reps.aborted() == ["c-1"]  # c-0 had finished: nothing to abort there
        d.replica_output(1, step(output("c-1", "", True, "cancelled")))
        assert d.router.outstanding(1) == 0
        assert d.metrics.sequences.get("cancelled") == 1

    run(test)


def test_a_request_past_its_timeout_gets_504_and_its_sequences_count_as_timeouts() -> None:
    async def test(d: Dispatcher, reps: Replicas) -> None:
        group = d.submit(submits("t", 1), timeout_s=0.05)
        index, event = await group.next()
        assert isinstance(event, Failure) and event.status == 504 and group.finished
        group.close()
        assert reps.aborted() == ["t-0"]
        d.replica_output(0, step(output("t-0", "", True, "cancelled")))
        assert d.metrics.sequences.get("timeout") == 1 and d.metrics.sequences.get("cancelled") == 0

    run(test)


def test_abort_all_ends_every_running_sequence_with_503() -> None:
    async def test(d: Dispatcher, reps: Replicas) -> None:
        group = d.submit(submits("s", 3))
        assert d.abort_all("stopping") == 3
        events = await drain(group)
        assert [e for _, e in events] == [Failure(503, "stopping")] * 3
        assert sorted(reps.aborted()) == ["s-0", "s-1", "s-2"]

    run(test)


# -- aggregation: a group's events -> one HTTP answer ----------------------------------------------------------
def request() -> Request:
    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)  # a client that stays connected
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


async def body_of(response: Any) -> str:
    parts = [p if isinstance(p, str) else p.decode() async for p in response.body_iterator]
    return "".join(parts)


def test_a_whole_answer_puts_choices_in_input_order_and_counts_each_prompt_once() -> None:
    async def test(d: Dispatcher, reps: Replicas) -> None:
        group = d.submit(submits("w", 2))
        d.replica_output(1, step(output("w-1", "second", True, "length")))
        d.replica_output(0, step(output("w-0", "fir", False), output("w-0", "st", True, "stop")))
        render = TextRenderer("cmpl-1", 0, "m", logprobs=False)
        response = await respond(group, render, request(), stream=False, n=2)
        body = json.loads(response.body)
        assert [c["text"] for c in body["choices"]] == ["first", "second"]
        assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
        assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11,
                                 "prompt_tokens_details": {"cached_tokens": 2},
                                 "completion_tokens_details": {"accepted_prediction_tokens": 0,
                                                               "rejected_prediction_tokens": 0}}
        assert response.headers["x-llamafleet-replicas"] == "0,1"

    run(test)


def test_a_stream_that_fails_half_way_ends_with_an_error_event_and_aborts_the_rest() -> None:
    async def test(d: Dispatcher, reps: Replicas) -> None:
        group = d.submit(submits("f", 2))
        d.replica_output(0, step(output("f-0", "Hel")))
        d.replica_output(1, step(rejected=(Rejected("f-1", "the replica failed on it", 500),)))
        render = ChatRenderer("chatcmpl-1", 0, "m", logprobs=False, include_usage=True)
        response = await respond(group, render, request(), stream=True, n=2)
        events = [line.removeprefix("data: ") for line in (await body_of(response)).splitlines() if line]
        assert events[-1] == "[DONE]"  # the stream ends the one way streams end, after the error event
        chunks = [json.loads(e) for e in events[:-1]]
        assert [c["choices"][0]["delta"] for c in chunks[:2]] == [{"role": "assistant", "content": ""}] * 2
        assert chunks[2]["choices"][0]["delta"]["content"] == "Hel"
        error = chunks[-1]["error"]  # a replica's 500 reaches the client as an error id, not its text
        assert error["code"] == "internal_error" and "error id" in error["message"]
        assert "failed on it" not in error["message"]
        await response.background()  # what Starlette runs after the body: the group is closed
        assert reps.aborted() == ["f-0"]

    run(test)


def test_a_suspect_replicas_unstarted_sequences_move_and_what_it_says_later_is_ignored() -> None:
    """Replica 1 falls silent: its sequence that is streaming stays; the one not started moves to replica 0 (aborted
    on 1, sent to 0) and new work goes to 0. When 1 wakes up, a token of the moved sequence from the step it was
    frozen in and the abort's cancellation are dropped: each sequence ends once, and no count is left behind."""
    async def test(d: Dispatcher, reps: Replicas) -> None:
        group = d.submit(submits("q", 4))
        assert group.replicas == [0, 1, 0, 1]
        d.replica_output(1, step(output("q-1", "x")))  # q-1 streams on replica 1
        d.replica_suspect(1, True)
        assert reps.aborted() == ["q-3"] and reps.submitted(0) == ["q-0", "q-2", "q-3"]
        assert group.replicas == [0, 1, 0, 0] and d.metrics.moved.get() == 1
        later = d.submit(submits("n", 2))
        assert later.replicas == [0, 0]
        d.replica_output(1, step(output("q-3", "stale"), output("q-3", "", True, "cancelled")))  # 1 wakes up
        d.replica_suspect(1, False)
        d.replica_suspect(0, True)  # and 0 falls silent: q-3 never goes back to the replica it left
        assert reps.aborted() == ["q-3", "q-0", "q-2", "n-0", "n-1"]
        assert reps.submitted(1) == ["q-1", "q-3", "q-0", "q-2", "n-0", "n-1"]
        d.replica_suspect(0, False)
        d.replica_output(0, step(output("q-0", "late", True, "cancelled"), output("q-3", "z", True, "stop")))
        d.replica_output(1, step(*(output(rid, "z", True, "stop") for rid in ("q-1", "q-0", "q-2", "n-0", "n-1"))))
        events = await drain(group)
        assert all(isinstance(e, Delta) for _, e in events), events
        texts = sorted((i, e.output.text) for i, e in events if isinstance(e, Delta))
        assert texts == [(0, "z"), (1, "x"), (1, "z"), (2, "z"), (3, "z")]
        assert [d.router.outstanding(r) for r in (0, 1)] == [0, 0]
        assert d.metrics.sequences.get("cancelled") == 0 and d.metrics.sequences.get("stop") == 6

    run(test)


def test_with_nowhere_to_go_a_suspect_replicas_sequences_wait_there() -> None:
    async def test(d: Dispatcher, reps: Replicas) -> None:
        group = d.submit(submits("w", 2))
        d.replica_suspect(0, True)
        assert reps.aborted() == [] and group.replicas == [0, 0]
        assert d.submit(submits("x", 1)).replicas == [0]  # the only replica: new work waits for it too
        d.replica_output(0, step(*(output(rid, "k", True, "stop") for rid in ("w-0", "w-1", "x-0"))))
        assert len(await drain(group)) == 2

    run(test, n_replicas=1)


def test_what_could_not_move_off_a_suspect_replica_moves_when_room_comes_free() -> None:
    async def test(d: Dispatcher, reps: Replicas) -> None:
        group = d.submit(submits("f", 8))  # 4 slots each, no queue: both full
        d.replica_suspect(1, True)
        assert reps.aborted() == []  # nowhere to go yet
        d.replica_output(0, step(output("f-0", "a", True, "stop")))  # a slot of replica 0 comes free
        assert reps.aborted() == ["f-1"] and reps.submitted(0)[-1] == "f-1"  # the oldest waiting on 1 takes it
        assert group.replicas[1] == 0 and d.metrics.moved.get() == 1
        d.replica_output(0, step(output("f-2", "b")))  # a token, nothing ended: nothing more moves
        assert reps.aborted() == ["f-1"]

    run(test, router=Router(2, "least_outstanding", max_queue_per_replica=0))
