"""The Prometheus text exposition: counters, gauges, histograms, label escaping, and the fleet's own metrics."""

from __future__ import annotations

import pytest

from llamafleet.engine.types import EngineStats
from llamafleet.fleet.metrics import Counter, Gauge, Histogram, Registry
from llamafleet.fleet.snapshot import FleetSnapshot, ModelView, ReplicaView, publish
from llamafleet.fleet.telemetry import FleetMetrics, GpuSample


def test_counter_and_gauge_render_with_help_type_and_escaped_labels() -> None:
    reg = Registry()
    c = reg.add(Counter("jobs_total", "jobs done", ("kind",)))
    g = reg.add(Gauge("depth", "queue depth"))
    c.inc('a"b\\c\nd')
    c.inc("plain", amount=2.5)
    g.set(7)
    assert reg.render() == (
        "# HELP jobs_total jobs done\n# TYPE jobs_total counter\n"
        'jobs_total{kind="a\\"b\\\\c\\nd"} 1\n'
        'jobs_total{kind="plain"} 2.5\n'
        "# HELP depth queue depth\n# TYPE depth gauge\ndepth 7\n"
    )
    with pytest.raises(ValueError, match="cannot decrease"):
        c.inc("plain", amount=-1)
    with pytest.raises(ValueError, match="takes labels"):
        c.inc()
    c.set_total(4, "plain")
    with pytest.raises(ValueError, match="cannot go down"):
        c.set_total(3, "plain")
    with pytest.raises(ValueError, match="registered twice"):
        reg.add(Gauge("depth", "again"))


def test_histogram_buckets_are_cumulative_with_sum_and_count() -> None:
    h = Histogram("lat_seconds", "latency", ("route",), buckets=(0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v, "/x")
    assert list(h.lines()) == [
        'lat_seconds_bucket{route="/x",le="0.1"} 2',
        'lat_seconds_bucket{route="/x",le="1"} 3',
        'lat_seconds_bucket{route="/x",le="+Inf"} 4',
        'lat_seconds_sum{route="/x"} 3.65',
        'lat_seconds_count{route="/x"} 4',
    ]
    assert h.count("/x") == 4
    with pytest.raises(ValueError, match="increasing"):
        Histogram("bad", "x", buckets=(1.0, 0.5))


def _fleet(*replicas: ReplicaView, queue_depth: int = 0, gpus: tuple[GpuSample, ...] = (),
           overloaded: str | None = None) -> FleetSnapshot:
    model = ModelView(name="m", aliases=(), state="loaded", pinned=True, n_ctx_per_seq=512, waiting=0, where=(),
                      last_error=None, plan=None, prefix="", replicas=replicas, queue_depth=queue_depth)
    return FleetSnapshot((model,), gpus, overloaded)


def test_fleet_refresh_reflects_replicas_queue_and_gpus() -> None:
    m = FleetMetrics()
    up = ReplicaView(id="0", index=0, model="m", where="GPU 0", status="ready", slots=1, restarts=2, suspicions=1,
                     outstanding=3, queued=2, stats=EngineStats(slots_total=1, slots_busy=1, waiting=1,
                                                                kv_tokens_used=30, kv_tokens_total=512, steps=9,
                                                                prompt_tokens_total=10, generated_tokens_total=20,
                                                                decode_seconds_total=0.5, step_seconds_total=0.6,
                                                                sample_seconds_total=0.1))
    down = ReplicaView(id="1", index=1, model="m", where="GPU 1", status="down")
    gpu = GpuSample(0, "H200", used_bytes=3 << 30, total_bytes=4 << 30, utilization_pct=55.0)
    publish(_fleet(up, down, queue_depth=2, gpus=(gpu,), overloaded="GPU 0 is full"), m)
    text = m.registry.render()
    for line in ('llamafleet_replica_up{replica="0",where="GPU 0"} 1',
                 'llamafleet_replica_up{replica="1",where="GPU 1"} 0',
                 'llamafleet_replica_restarts_total{replica="0"} 2', 'llamafleet_replica_slots_busy{replica="0"} 1',
                 'llamafleet_replica_suspect_total{replica="0"} 1',
                 'llamafleet_replica_outstanding{replica="0"} 3', "llamafleet_queue_depth 2",
                 'llamafleet_kv_cache_tokens_used{replica="0"} 30', 'llamafleet_engine_steps_total{replica="0"} 9',
                 'llamafleet_gpu_memory_used_bytes{gpu="0",name="H200"} 3221225472',
                 'llamafleet_gpu_utilization_ratio{gpu="0",name="H200"} 0.55', "llamafleet_overloaded 1",
                 'llamafleet_model_queue_depth{model="m"} 2', 'llamafleet_model_state{model="m",state="loaded"} 1'):
        assert line in text.splitlines(), line
    assert gpu.used_fraction == 0.75


def test_engine_steps_keep_counting_across_a_replica_restart() -> None:
    m = FleetMetrics()

    def refresh(pid: int, steps: int) -> float:
        st = ReplicaView(id="0", index=0, model="m", where="GPU 0", status="ready", pid=pid,
                         stats=EngineStats(slots_total=1, slots_busy=0, waiting=0, kv_tokens_used=0,
                                           kv_tokens_total=512, steps=steps, prompt_tokens_total=0,
                                           generated_tokens_total=0, decode_seconds_total=0.0, step_seconds_total=0.0,
                                           sample_seconds_total=0.0))
        publish(_fleet(st), m)
        return m.steps.get("0")

    assert [refresh(10, 9), refresh(10, 12), refresh(11, 3), refresh(11, 5)] == [9, 12, 15, 17]
