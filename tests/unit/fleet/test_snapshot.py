"""The fleet snapshot: what it reads from the replica sets and routers, and the readiness it reports."""

from __future__ import annotations

import asyncio

from llamafleet.config import FleetConfig
from llamafleet.engine.types import EngineConfig, EngineStats
from llamafleet.fleet.dispatch import Dispatcher
from llamafleet.fleet.launch import ReplicaSpec
from llamafleet.fleet.models import ManagedModel, ModelManager
from llamafleet.fleet.replicas import ReplicaSet
from llamafleet.fleet.router import Router
from llamafleet.fleet.snapshot import take
from llamafleet.fleet.telemetry import FleetMetrics, GpuSample


def _manager() -> ModelManager:
    specs = [ReplicaSpec(env={}, engine=EngineConfig(model_path="m.gguf"), label="GPU 0", gpus=(0,)),
             ReplicaSpec(env={}, engine=EngineConfig(model_path="m.gguf"), label="GPU 1", gpus=(1,))]
    dispatcher = Dispatcher(ReplicaSet(specs, "info", 60.0), Router(2, "least_outstanding"), replica_prefix="chat/")
    chat = ManagedModel(name="chat", aliases=("c",), pinned=True, idle_ttl_s=None, n_ctx_per_seq=512,
                        dispatcher=dispatcher, state="loading")
    coder = ManagedModel(name="coder", aliases=(), pinned=False, idle_ttl_s=None, n_ctx_per_seq=1024)
    return ModelManager([chat, coder], FleetConfig.model_validate({}), FleetMetrics())


def test_a_snapshot_copies_states_router_counts_and_placement() -> None:
    async def main() -> None:
        models = _manager()
        d = models.models[0].dispatcher
        assert d is not None
        states, router = d.replicas.states, d.router
        states[0].status, states[0].slots, states[0].pid = "ready", 1, 1234
        states[0].stats = EngineStats(slots_total=1, slots_busy=1, waiting=2, kv_tokens_used=30, kv_tokens_total=512,
                                      steps=9, prompt_tokens_total=10, generated_tokens_total=20,
                                      decode_seconds_total=0.5, step_seconds_total=0.6, sample_seconds_total=0.1)
        states[1].status, states[1].load_fraction = "loading", 0.5
        router.set_up(0, 1)
        for rid in ("a", "b", "c"):
            router.assign(rid)
        gpu = GpuSample(0, "H200", 1, 2, None)
        snap = take(models, [gpu], "GPU 0 is full")

        chat, coder = snap.models
        assert (chat.name, chat.aliases, chat.prefix, chat.queue_depth, chat.decisions["load"]) == (
            "chat", ("c",), "chat/", 2, 3)
        assert chat.load_progress == 0.75 and not chat.all_up and chat.serving
        r0, r1 = chat.replicas
        assert (r0.id, r0.index, r0.model, r0.where, r0.gpus, r0.pid) == ("chat/0", 0, "chat", "GPU 0", (0,), 1234)
        assert (r0.outstanding, r0.queued, r0.slots_busy, r0.waiting, r0.generated_tokens) == (3, 2, 1, 2, 20)
        assert (r1.id, r1.status, r1.outstanding, r1.stats) == ("chat/1", "loading", 0, None)
        assert coder.replicas == () and coder.n_ctx_per_seq == 1024 and coder.state == "unloaded"
        assert snap.replicas() == [r0, r1] and snap.gpus == (gpu,) and snap.queue_depth() == 2
        assert snap.readiness(loaded=True) == "overloaded"

        router.assign("d")
        states[0].restarts = 5
        assert (r0.outstanding, r0.restarts) == (3, 0)  # a copy: what a caller holds does not change under it

    asyncio.run(main())


def test_readiness_follows_the_pinned_models_replicas() -> None:
    async def main() -> None:
        models = _manager()
        d = models.models[0].dispatcher
        assert d is not None
        states = d.replicas.states
        assert take(models).readiness(loaded=False) == "loading"
        assert take(models).readiness(loaded=True) == "down"  # no replica of the pinned model is up
        states[0].status = "ready"
        assert take(models).readiness(loaded=True) == "degraded"
        states[1].status = "ready"
        assert take(models).readiness(loaded=True) == "ready"
        states[1].suspect = True  # up, but taking no new work
        assert take(models).readiness(loaded=True) == "degraded"

    asyncio.run(main())
