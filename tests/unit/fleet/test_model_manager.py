"""The model manager's state machine (fleet/models.py): load on demand, one load at a time, LRU eviction after the
evicted model's requests finish, idle TTL, the bounded wait for a load, pinned models, a failed load.

Everything is real except the workers: the manager, packing and planning (sparse 7B/13B models on a described
2 x 24 GB machine, as in test_packing.py), replica sets, routers and dispatchers, over the real pipe protocol. The
workers come from :class:`ThreadLauncher`, an in-process launcher of the replica set's ``Launcher`` seam: each
worker is a thread on the other end of a socket pair that loads nothing, answers ``Ready`` when its model's gate
opens (or ``LoadFailed``), and answers each request once the test lets it."""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from llamafleet.api.errors import ApiError
from llamafleet.api.service import Service
from llamafleet.config import FleetConfig
from llamafleet.engine.types import EngineStats, RequestOutput, SamplingParams
from llamafleet.fleet import models as models_module
from llamafleet.fleet.dispatch import Delta, Failure
from llamafleet.fleet.launch import Launched, ReplicaSpec
from llamafleet.fleet.messages import LoadFailed, Ready, Shutdown, StepOutputs, Submit
from llamafleet.fleet.models import LOAD_RETRY_S, ManagedModel, ModelManager, ModelUnavailable, NotUnloadable
from llamafleet.fleet.pipe import WorkerPipe
from llamafleet.fleet.telemetry import FleetMetrics
from llamafleet.model.header import ModelInfo
from llamafleet.placement.gpus import load_inventory
from llamafleet.placement.packing import Demand, pack
from synth_models import sparse_models

TWO = load_inventory(Path(__file__).resolve().parents[3] / "examples" / "inventories" / "2x24gb-pcie.yaml")
STATS = EngineStats(slots_total=1, slots_busy=0, waiting=0, kv_tokens_used=0, kv_tokens_total=1, steps=0,
                    prompt_tokens_total=0, generated_tokens_total=0, decode_seconds_total=0.0, step_seconds_total=0.0,
                    sample_seconds_total=0.0)
WAIT_S = 30.0  # the most any step here may take on a loaded machine; the tests wait on events, not on time


class ThreadWorker:
    """One replica's worker as a thread (the ``WorkerHandle`` supervision sees)."""

    def __init__(self, sock: socket.socket, spec: ReplicaSpec, launcher: ThreadLauncher) -> None:
        self.pipe, self.spec, self.launcher = WorkerPipe(sock), spec, launcher
        self.exitcode: int | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def pid(self) -> int | None:
        return os.getpid()

    def _run(self) -> None:
        model = self.spec.label.split(" on ")[0]
        try:
            self.launcher.gate(model).wait(WAIT_S)
            with self.launcher.lock:
                self.launcher.loading -= 1
            if model in self.launcher.failing:
                self.pipe.send(LoadFailed(f"{model} cannot load (as the test asked)"))
                return
            self.pipe.send(Ready(pid=os.getpid(), n_seq=self.spec.engine.n_seq,
                                 n_ctx_per_seq=self.spec.engine.n_ctx_per_seq, load_seconds=0.0))
            while not isinstance(msg := self.pipe.recv(), Shutdown):
                if isinstance(msg, Submit):
                    if (held := self.launcher.held.get(msg.request_id)) is not None:
                        held.wait(WAIT_S)
                    out = RequestOutput(msg.request_id, text="ok", token_ids=[1], finished=True, finish_reason="stop",
                                        prompt_tokens=1, completion_tokens=1)
                    self.pipe.send(StepOutputs(outputs=[out], rejected=[], pieces={}, stats=STATS))
        except (OSError, EOFError):
            pass
        finally:
            self.exitcode = 0
            self.pipe.close()

    def kill(self) -> None:
        self.pipe.close()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()


class ThreadLauncher:
    """Starts :class:`ThreadWorker` s; counts the loads running at once; holds a model's loads while its gate is
    closed and fails those of the models in ``failing``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.gates: dict[str, threading.Event] = {}
        self.held: dict[str, threading.Event] = {}  # requests answered once their event is set (others at once)
        self.failing: set[str] = set()
        self.loading = 0
        self.most_loading = 0
        self.launched: list[str] = []

    def gate(self, model: str) -> threading.Event:
        with self.lock:
            if model not in self.gates:
                self.gates[model] = threading.Event()
                self.gates[model].set()
            return self.gates[model]

    def hold(self, model: str) -> None:
        """Hold the loads of ``model`` until its gate is set."""
        self.gate(model).clear()

    def hold_answer(self, request_id: str) -> threading.Event:
        """Hold the answer to ``request_id`` until the event returned is set."""
        self.held[request_id] = threading.Event()
        return self.held[request_id]

    def release_all(self) -> None:
        for event in [*self.gates.values(), *self.held.values()]:
            event.set()

    async def launch(self, replica: int, spec: ReplicaSpec, log_level: str, beat_s: float) -> Launched:
        parent, child = socket.socketpair()
        with self.lock:
            self.loading += 1
            self.most_loading = max(self.most_loading, self.loading)
            self.launched.append(spec.label.split(" on ")[0])
        return Launched(ThreadWorker(child, spec, self), parent, spec.label)


@pytest.fixture(scope="module")
def infos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelInfo]:
    return sparse_models(tmp_path_factory)


@pytest.fixture(autouse=True)
def no_reaper(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The idle reaper runs only where a test asks for it (it also marks models with requests in flight as used)."""
    monkeypatch.setattr(models_module, "REAP_S", 3600.0)
    monkeypatch.setattr(models_module, "DRAIN_POLL_S", 0.01)
    yield


def fleet(infos: dict[str, ModelInfo], **cfg: Any) -> tuple[list[ManagedModel], FleetConfig]:
    """chat (13B Q8_0, pinned) fills most of GPU 0, coder (7B F16) most of GPU 1, small fits beside coder, wide
    (7B Q4_0 with 6 slots) fits only where coder or chat is: loading wide must evict coder."""
    config = FleetConfig(**{"heartbeat_timeout_s": 600.0, **cfg})
    ttl = cfg.get("idle_ttl_s")
    demands = [Demand("chat", infos["13b-q8_0"], FleetConfig(replicas=1, parallel=1), True),
               Demand("coder", infos["7b-f16"], FleetConfig(replicas=1, parallel=1)),
               Demand("small", infos["7b-q4_0"], FleetConfig(replicas=1, parallel=1, context_length=2048)),
               Demand("wide", infos["7b-q4_0"], FleetConfig(replicas=1, parallel=6))]
    packing, fixed = pack(demands, TWO)
    assert packing.fits
    return [ManagedModel(d.name, aliases=(), pinned=d.pinned, idle_ttl_s=ttl,
                         n_ctx_per_seq=packing.shapes[d.name].n_ctx_per_seq, demand=d) for d in fixed], config


@asynccontextmanager
async def running(infos: dict[str, ModelInfo], launcher: ThreadLauncher | None = None,
                  **cfg: Any) -> AsyncIterator[ModelManager]:
    managed, config = fleet(infos, **cfg)
    launcher = launcher or ThreadLauncher()
    manager = ModelManager(managed, config, FleetMetrics(), TWO, launcher)
    await manager.start()
    try:
        yield manager
    finally:
        launcher.release_all()
        await manager.stop(5.0)


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test in a fresh event loop."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


async def until(condition: Any) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.01)


def model(manager: ModelManager, name: str) -> ManagedModel:
    found = manager.find(name)
    assert found is not None
    return found


async def ask(manager: ModelManager, name: str, rid: str) -> Any:
    """Send one request to ``name`` once it is loaded; its group."""
    m = model(manager, name)
    await manager.acquire(m)
    assert m.dispatcher is not None
    return m.dispatcher.submit([Submit(rid, SamplingParams(max_tokens=1), prompt="hi")])


async def answer(group: Any) -> Delta | Failure:
    _, event = await asyncio.wait_for(group.next(), WAIT_S)
    group.close()
    return event  # type: ignore[no-any-return]


@in_loop
async def test_the_pinned_model_loads_at_start_and_the_others_on_their_first_request(
        infos: dict[str, ModelInfo]) -> None:
    launcher = ThreadLauncher()
    async with running(infos, launcher) as manager:
        assert [m.state for m in manager.models] == ["loaded", "unloaded", "unloaded", "unloaded"]
        event = await answer(await ask(manager, "coder", "r1"))
        assert isinstance(event, Delta) and event.output.text == "ok"
        assert model(manager, "coder").state == "loaded" and launcher.launched == ["chat", "coder"]
        assert manager.metrics.model_loads.get("coder", "loaded") == 1


@in_loop
async def test_loads_run_one_at_a_time(infos: dict[str, ModelInfo]) -> None:
    launcher = ThreadLauncher()
    async with running(infos, launcher) as manager:
        launcher.hold("coder")
        both = asyncio.gather(manager.acquire(model(manager, "coder")), manager.acquire(model(manager, "small")))
        await until(lambda: launcher.launched == ["chat", "coder"])
        await asyncio.sleep(0.1)  # small's load would have started by now if loads overlapped
        assert launcher.launched == ["chat", "coder"] and model(manager, "small").state == "loading"
        launcher.gate("coder").set()
        await both
        assert launcher.most_loading == 1 and launcher.launched == ["chat", "coder", "small"]


@in_loop
async def test_a_load_evicts_the_least_recently_used_model_after_its_requests_finish(
        infos: dict[str, ModelInfo]) -> None:
    launcher = ThreadLauncher()
    async with running(infos, launcher) as manager:
        await manager.acquire(model(manager, "coder"))
        await manager.acquire(model(manager, "small"))
        release = launcher.hold_answer("long")
        running_request = await ask(manager, "coder", "long")  # coder is now the most recently used...
        await manager.acquire(model(manager, "small"))  # ...until small is used again
        loading = asyncio.ensure_future(manager.acquire(model(manager, "wide")))
        await until(lambda: model(manager, "coder").state == "unloading")
        await asyncio.sleep(0.1)
        assert model(manager, "coder").state == "unloading" and not loading.done()  # it drains first
        assert model(manager, "small").state == "loaded" and model(manager, "chat").state == "loaded"
        release.set()
        event = await answer(running_request)
        assert isinstance(event, Delta) and event.output.finish_reason == "stop"  # served, not aborted
        await asyncio.wait_for(loading, WAIT_S)
        assert model(manager, "coder").state == "unloaded" and model(manager, "wide").state == "loaded"
        assert manager.metrics.model_evictions.get("coder", "lru") == 1


@in_loop
async def test_a_model_idle_past_its_ttl_is_unloaded(infos: dict[str, ModelInfo]) -> None:
    models_module.REAP_S = 0.01  # put back by no_reaper
    async with running(infos, idle_ttl_s=0.05) as manager:
        coder = model(manager, "coder")
        await manager.acquire(coder)
        await until(lambda: coder.state == "unloaded")
        assert manager.metrics.model_evictions.get("coder", "idle") == 1
        assert model(manager, "chat").state == "loaded"  # pinned: never idle-unloaded


@in_loop
async def test_a_request_waits_for_a_load_at_most_request_timeout_s(infos: dict[str, ModelInfo]) -> None:
    launcher = ThreadLauncher()
    async with running(infos, launcher, request_timeout_s=0.2) as manager:
        launcher.hold("coder")
        with pytest.raises(ModelUnavailable, match="did not load within 0.2s"):
            await manager.acquire(model(manager, "coder"))
        assert model(manager, "coder").state == "loading"  # the load goes on for the next request


@in_loop
async def test_past_max_loading_queue_a_request_gets_503_with_retry_after(infos: dict[str, ModelInfo]) -> None:
    launcher = ThreadLauncher()
    async with running(infos, launcher, max_loading_queue=1) as manager:
        launcher.hold("coder")
        first = asyncio.ensure_future(manager.acquire(model(manager, "coder")))
        await until(lambda: model(manager, "coder").waiting == 1)
        with pytest.raises(ApiError) as refused:
            await Service(manager).for_model("small")
        assert refused.value.status == 503 and "already wait" in refused.value.message
        assert refused.value.headers == {"Retry-After": str(LOAD_RETRY_S)}
        assert manager.metrics.refused.get("loading_queue_full") == 1
        launcher.gate("coder").set()
        await asyncio.wait_for(first, WAIT_S)


@in_loop
async def test_pinned_models_are_never_evicted_or_unloaded(infos: dict[str, ModelInfo]) -> None:
    async with running(infos) as manager:
        for name in ("coder", "small", "wide", "coder"):
            await manager.acquire(model(manager, name))
            assert model(manager, "chat").state == "loaded"
        with pytest.raises(NotUnloadable):
            await manager.unload(model(manager, "chat"))
        assert manager.metrics.model_evictions.get("chat", "lru") == 0


@in_loop
async def test_a_failed_load_is_reported_and_the_next_request_tries_again(infos: dict[str, ModelInfo]) -> None:
    launcher = ThreadLauncher()
    launcher.failing.add("coder")
    async with running(infos, launcher) as manager:
        coder = model(manager, "coder")
        with pytest.raises(ModelUnavailable, match="failed to load: .*cannot load"):
            await manager.acquire(coder)
        assert coder.state == "failed" and coder.failures == 1 and coder.placed is None
        assert manager.metrics.model_loads.get("coder", "failed") == 1
        launcher.failing.clear()
        await manager.acquire(coder)
        assert coder.state == "loaded"
