"""The last minutes of the fleet's numbers, sampled once a second, for the dashboard's sparklines.

The history is kept here, in the API process, rather than built up by each open page: a page opened (or reloaded)
after a burst still shows the minutes before it, every viewer sees the same numbers, and the cost is fixed whatever
the number of viewers: one sample a second reads only state already in memory (the workers' last engine stats, the
router's counts, the watchdog's last NVML scan, the metrics' histograms), about 1 KB per sample for 2 replicas,
300 samples (:data:`SPAN_S` = five minutes, a few hundred KB at most for a large machine).

Rates and means are per interval, from the same counters and histograms ``GET /metrics`` exports: tokens per second
from each worker's generated-token count, time to first token and time between tokens as the mean of what the
dispatcher observed (``llamafleet_time_to_first_token_seconds``, ``llamafleet_inter_token_seconds``) during the
interval, ``None`` when nothing was observed.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from llamafleet.fleet.metrics import Histogram
from llamafleet.fleet.snapshot import FleetSnapshot, ReplicaView
from llamafleet.fleet.telemetry import FleetMetrics, GpuSample

INTERVAL_S = 1.0
SPAN_S = 300.0


def utilization(gpu: GpuSample) -> float | None:
    """The GPU's busy fraction (0..1) as ``llamafleet_gpu_utilization_ratio`` has it; None where NVML has none."""
    return None if gpu.utilization_pct is None else gpu.utilization_pct / 100


def mean_of(histogram: Histogram, *labels: str) -> float | None:
    """The mean of every observation of ``histogram`` with ``labels`` so far; None before the first."""
    n = histogram.count(*labels)
    return histogram.total(*labels) / n if n else None


@dataclass(frozen=True)
class _Totals:
    """One replica's running totals at a sample, to difference with the next one."""

    pid: int | None
    generated: int
    ttft: tuple[float, int]  # (sum, count) of the histogram
    gap: tuple[float, int]

    @classmethod
    def of(cls, r: ReplicaView, metrics: FleetMetrics) -> _Totals:
        return cls(r.pid, r.generated_tokens, (metrics.ttft.total(r.id), metrics.ttft.count(r.id)),
                   (metrics.token_gap.total(r.id), metrics.token_gap.count(r.id)))


def _interval_mean(now: tuple[float, int], before: tuple[float, int]) -> float | None:
    n = now[1] - before[1]
    return (now[0] - before[0]) / n if n > 0 else None


def _pooled(means: Iterable[tuple[float | None, int]]) -> float | None:
    """The mean of several means, weighted by how many observations each has."""
    pairs = [(m, n) for m, n in means if m is not None and n > 0]
    total = sum(n for _, n in pairs)
    return sum(m * n for m, n in pairs) / total if total else None


class History:
    """A ring of samples (plain JSON-ready dicts), oldest first; :meth:`sample` adds one."""

    def __init__(self, metrics: FleetMetrics, span_s: float = SPAN_S, interval_s: float = INTERVAL_S) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self.span_s = span_s
        self.samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=max(1, int(span_s / interval_s)))
        self._before: dict[str, _Totals] = {}  # by replica label
        self._before_t: float | None = None

    def sample(self, snap: FleetSnapshot, now: float) -> dict[str, Any]:
        """Record the fleet of ``snap`` at ``now`` (Unix time) and return the sample; replicas are named by the labels
        ``/metrics`` uses ("0" for a lone model, "chat/0" with several)."""
        dt = None if self._before_t is None else now - self._before_t
        replicas: list[dict[str, Any]] = []
        ttfts, gaps = [], []
        for r in snap.replicas():
            totals = _Totals.of(r, self.metrics)
            before = self._before.get(r.id, totals)
            # a restarted worker (new pid) counts its tokens from 0 again
            fresh = totals.generated - (before.generated if before.pid == totals.pid else 0)
            ttft = _interval_mean(totals.ttft, before.ttft)
            gap = _interval_mean(totals.gap, before.gap)
            ttfts.append((ttft, totals.ttft[1] - before.ttft[1]))
            gaps.append((gap, totals.gap[1] - before.gap[1]))
            replicas.append({
                "id": r.id, "index": r.index, "status": r.status, "slots_busy": r.slots_busy, "waiting": r.waiting,
                "outstanding": r.outstanding, "tokens_per_s": fresh / dt if dt else 0.0, "ttft_s": ttft, "itl_s": gap,
            })
            self._before[r.id] = totals
        self._before_t = now
        sample = {
            "t": round(now, 3),
            "queue_depth": snap.queue_depth(),
            "tokens_per_s": sum(r["tokens_per_s"] for r in replicas),
            "ttft_s": _pooled(ttfts), "itl_s": _pooled(gaps),
            "replicas": replicas,
            "gpus": [{"index": g.index, "used_bytes": g.used_bytes, "utilization": utilization(g)} for g in snap.gpus],
        }
        self.samples.append(sample)
        return sample

    def since(self, t: float) -> list[dict[str, Any]]:
        """The samples taken after ``t`` (Unix time), oldest first."""
        return [s for s in self.samples if s["t"] > t]
