"""The dashboard's history ring: rates and interval means from the same counters and histograms as ``/metrics``."""

from __future__ import annotations

import pytest

from llamafleet.engine.types import EngineStats
from llamafleet.fleet.history import History
from llamafleet.fleet.snapshot import FleetSnapshot, ModelView, ReplicaView
from llamafleet.fleet.telemetry import FleetMetrics, GpuSample


def _state(index: int, pid: int, generated: int, busy: int = 0, prefix: str = "") -> ReplicaView:
    stats = EngineStats(slots_total=4, slots_busy=busy, waiting=0, kv_tokens_used=0, kv_tokens_total=512, steps=0,
                        prompt_tokens_total=0, generated_tokens_total=generated, decode_seconds_total=0.0,
                        step_seconds_total=0.0, sample_seconds_total=0.0)
    return ReplicaView(id=f"{prefix}{index}", index=index, model=prefix.strip("/") or "m", where="CPU",
                       status="ready", pid=pid, slots=4, stats=stats)


def _fleet(*models: tuple[ReplicaView, ...], gpus: tuple[GpuSample, ...] = ()) -> FleetSnapshot:
    """A snapshot of models holding these replicas (named after the first one's model)."""
    return FleetSnapshot(tuple(ModelView(name=r[0].model, aliases=(), state="loaded", pinned=True, n_ctx_per_seq=512,
                                         waiting=0, where=(), last_error=None, plan=None, prefix="", replicas=r)
                               for r in models), gpus)


def test_rates_and_means_are_per_interval_and_survive_a_restart() -> None:
    metrics = FleetMetrics()
    history = History(metrics)
    gpu = GpuSample(0, "H200", 10 * 2**30, 140 * 2**30, 35.0)
    first = history.sample(_fleet((_state(0, 100, 50), _state(1, 200, 0)), gpus=(gpu,)), now=1000.0)
    assert first["tokens_per_s"] == 0.0 and first["ttft_s"] is None  # nothing to compare with yet
    assert first["gpus"] == [{"index": 0, "used_bytes": 10 * 2**30, "utilization": 0.35}]

    metrics.ttft.observe(0.2, "0")
    metrics.ttft.observe(0.4, "1")
    metrics.ttft.observe(0.6, "1")
    metrics.token_gap.observe(0.05, "0")
    second = history.sample(_fleet((_state(0, 100, 150, busy=2), _state(1, 200, 40))), now=1002.0)
    r0, r1 = second["replicas"]
    assert (r0["tokens_per_s"], r1["tokens_per_s"], second["tokens_per_s"]) == (50.0, 20.0, 70.0)
    assert r0["ttft_s"] == pytest.approx(0.2) and r1["ttft_s"] == pytest.approx(0.5)
    assert second["ttft_s"] == pytest.approx(0.4)  # all three observations, not the mean of the two means
    assert r0["itl_s"] == pytest.approx(0.05) and r1["itl_s"] is None and r0["slots_busy"] == 2

    # replica 1 restarted (new pid): its count starts again from 0, all of it new
    third = history.sample(_fleet((_state(0, 100, 150), _state(1, 201, 30))), now=1003.0)
    assert [r["tokens_per_s"] for r in third["replicas"]] == [0.0, 30.0]
    assert third["ttft_s"] is None  # nothing observed in this interval
    assert [s["t"] for s in history.since(1000.0)] == [1002.0, 1003.0]


def test_the_ring_keeps_only_its_span() -> None:
    history = History(FleetMetrics(), span_s=10, interval_s=1)
    for t in range(25):
        history.sample(_fleet((_state(0, 1, t),)), now=float(t))
    assert [s["t"] for s in history.samples] == [float(t) for t in range(15, 25)]


def test_replicas_of_several_models_are_told_apart_by_their_labels() -> None:
    metrics = FleetMetrics()
    history = History(metrics)
    history.sample(_fleet((_state(0, 100, 10, prefix="chat/"),), (_state(0, 200, 10, prefix="coder/"),)), now=1000.0)
    metrics.ttft.observe(0.3, "coder/0")
    sample = history.sample(_fleet((_state(0, 100, 20, prefix="chat/"),), (_state(0, 200, 40, prefix="coder/"),)),
                            now=1001.0)
    assert [(r["id"], r["tokens_per_s"], r["ttft_s"]) for r in sample["replicas"]] == [
        ("chat/0", 10.0, None), ("coder/0", 30.0, pytest.approx(0.3))]
