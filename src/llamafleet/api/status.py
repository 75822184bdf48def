"""``GET /v1/status``: the fleet's numbers as one JSON document, for the dashboard (``/ui``) and for scripts.

The numbers are the ones ``GET /metrics`` exports, read from the same places (the workers' engine stats, the router,
the dispatcher's histograms, the watchdog's NVML scan), plus what a page needs and Prometheus text cannot carry: the
plan with its reasons, each device's memory as planned (weights / KV cache / compute buffers / margin) next to what
is measured, the last minutes of history (:mod:`llamafleet.fleet.history`) and the recent requests and errors
(:mod:`llamafleet.api.recent`). It needs an API key when keys are on, like every route but the probes.

Shape, for clients that add levels later: every replica names its ``model``, ``models`` lists the served models
with their replicas, ``plans`` is a list (one plan per model) and each device's ``planned`` is a list of parts (one
per replica placed on it), so several models per server add entries, not fields. ``?since=T`` (Unix time) returns
only the history samples taken after ``T``: a page that polls gets each sample once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any, cast

from fastapi import APIRouter, Request

from llamafleet import __version__
from llamafleet.api.errors import ApiError
from llamafleet.api.recent import RecentRequests
from llamafleet.api.service import Service
from llamafleet.fleet.history import INTERVAL_S, History, mean_of, utilization
from llamafleet.fleet.metrics import Counter
from llamafleet.fleet.replicas import ReplicaState
from llamafleet.fleet.telemetry import GpuSample
from llamafleet.placement.plan import Budget

log = logging.getLogger(__name__)
routes = APIRouter()


class Dashboard:
    """What the status endpoint reads besides the service: the history ring and the recent requests and errors."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.history = History(service.metrics)
        self.recent = RecentRequests(service.config.recent_request_contents)
        self._stops: dict[int, tuple[int, str | None]] = {}  # replica -> (restarts + hangs, last error) seen

    async def run(self) -> None:
        """Sample every :data:`~llamafleet.fleet.history.INTERVAL_S` until cancelled."""
        while True:
            try:
                self.sample()
            except Exception:  # a bug here must not end the history for the life of the server
                log.exception("the dashboard's sampler failed; its history has a gap")
            await asyncio.sleep(INTERVAL_S)

    def sample(self) -> None:
        svc = self.service
        states = svc.dispatcher.replicas.states
        self.history.sample(states, svc.dispatcher.router, svc.gpus, time.time())
        for st in states:
            seen = (st.restarts + st.hangs, st.last_error)
            if st.last_error is not None and self._stops.get(st.index, (0, None)) != seen:
                self.recent.replica_error(st.index, st.last_error)
            self._stops[st.index] = seen


def _pss_bytes(pid: int | None) -> int | None:
    """A process's proportional set size (shared pages divided among their users), where Linux tells it."""
    if pid is None:
        return None
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return None


def _labelled(counter: Counter) -> dict[str, float]:
    """A one-label counter as {label value: count}."""
    return {key[0]: value for key, value in counter.samples().items()}


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _replica(st: ReplicaState, svc: Service, latest: dict[str, Any] | None) -> dict[str, Any]:
    m, router, stats, rep = svc.metrics, svc.dispatcher.router, st.stats, str(st.index)
    cached = stats.prompt_tokens_cached_total if stats else 0
    computed = stats.prompt_tokens_total if stats else 0
    return {
        "index": st.index, "model": svc.model_name, "where": st.label,
        "gpus": list(svc.dispatcher.replicas.specs[st.index].gpus), "status": st.status, "pid": st.pid,
        "load_fraction": st.load_fraction, "restarts": st.restarts, "hangs": st.hangs,
        "up_since": None if st.up_since is None else time.time() - (time.monotonic() - st.up_since),
        "slots": st.slots, "slots_busy": stats.slots_busy if stats else 0, "waiting": stats.waiting if stats else 0,
        "outstanding": router.outstanding(st.index), "queued": router.queued(st.index),
        "kv_tokens_used": stats.kv_tokens_used if stats else 0, "kv_tokens": stats.kv_tokens_total if stats else 0,
        "generated_tokens": stats.generated_tokens_total if stats else 0,
        "prompt_tokens_computed": computed, "prompt_tokens_cached": cached,
        "cache_hit_rate": _ratio(cached, cached + computed),
        "tokens_per_s": latest["replicas"][st.index]["tokens_per_s"] if latest else 0.0,
        "ttft_s": mean_of(m.ttft, rep), "itl_s": mean_of(m.token_gap, rep),
        "memory_pss_bytes": _pss_bytes(st.pid), "last_error": st.last_error,
    }


def _gpu_index(device: str) -> int | None:
    """The NVML index of a plan's device name ("GPU 3" -> 3; "CPU" -> None)."""
    return int(device.removeprefix("GPU ")) if device.startswith("GPU ") else None


def _devices(svc: Service, replicas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each device's memory: the plan's parts (weights, KV cache, compute buffers, margin) and what is measured."""
    budgets: list[Budget] = list(svc.plan.budgets) if svc.plan else []
    measured: dict[int, GpuSample] = {g.index: g for g in svc.gpus}
    devices: list[dict[str, Any]] = []
    specs = svc.dispatcher.replicas.specs
    for b in budgets:
        index = _gpu_index(b.device)
        # a GPU's budget is its one replica's; the host's (a CPU plan) covers every replica on the CPU
        on_it = [i for i, spec in enumerate(specs) if (index in spec.gpus if index is not None else not spec.gpus)]
        part = {"model": svc.model_name, "replicas": on_it, "weights_mib": b.weights_mib, "kv_mib": b.kv_mib,
                "compute_mib": b.compute_mib, "margin_mib": b.margin_mib}
        devices.append({"device": b.device, "index": index, "name": b.name, "capacity_mib": b.capacity_mib,
                        "planned": [part] if b.replica is not None else [], "measured": None})
    for g in svc.gpus:  # a GPU the plan did not list (planned elsewhere, or no plan): measured only
        if not any(d["index"] == g.index for d in devices):
            devices.append({"device": f"GPU {g.index}", "index": g.index, "name": g.name, "capacity_mib": None,
                            "planned": [], "measured": None})
    for d in devices:
        if d["index"] is not None and d["index"] in measured:
            g = measured[d["index"]]
            d["measured"] = {"used_bytes": g.used_bytes, "total_bytes": g.total_bytes, "utilization": utilization(g)}
        elif d["index"] is None:  # the host: what the workers hold, shared pages counted once
            pss = [r["memory_pss_bytes"] for r in replicas if r["memory_pss_bytes"] is not None]
            d["measured"] = {"used_bytes": sum(pss), "total_bytes": None, "utilization": None} if pss else None
    return devices


def _totals(svc: Service, latest: dict[str, Any] | None) -> dict[str, Any]:
    m = svc.metrics
    indices = [str(st.index) for st in svc.dispatcher.replicas.states]
    prompt, cached = m.prompt_tokens.total(), m.prompt_cached.total()

    def pooled(h: Any) -> float | None:
        n = sum(h.count(i) for i in indices)
        return sum(h.total(i) for i in indices) / n if n else None

    return {
        "http_requests": m.http_requests.total(), "queue_depth": svc.dispatcher.router.queue_depth(),
        "prompt_tokens": prompt, "prompt_tokens_cached": cached, "generated_tokens": m.generated_tokens.total(),
        "cache_hit_rate": _ratio(cached, prompt),
        "tokens_per_s": latest["tokens_per_s"] if latest else 0.0,
        "ttft_s": pooled(m.ttft), "itl_s": pooled(m.token_gap),
        "sequences": _labelled(m.sequences), "refused": _labelled(m.refused),
        "routing": dict(svc.dispatcher.router.decisions),
    }


def status(dash: Dashboard, since: float) -> dict[str, Any]:
    """The whole document; see the module docstring and docs/API.md."""
    svc = dash.service
    states = svc.dispatcher.replicas.states
    samples = dash.history.samples
    latest = samples[-1] if samples else None
    replicas = [_replica(st, svc, latest) for st in states]
    plans = [svc.plan.to_json() | {"model": svc.model_name}] if svc.plan else []
    return {
        "version": __version__, "time": time.time(), "started": svc.created, "pid": os.getpid(),
        "status": svc.readiness, "overloaded": svc.overloaded,
        "models": [{"name": svc.model_name, "n_ctx_per_seq": svc.n_ctx_per_seq,
                    "replicas": [st.index for st in states]}],
        "totals": _totals(svc, latest),
        "replicas": replicas,
        "devices": _devices(svc, replicas),
        "plans": plans,
        "history": {"interval_s": dash.history.interval_s, "span_s": dash.history.span_s,
                    "samples": dash.history.since(since)},
        "recent": {"contents": dash.recent.contents,
                   "requests": [e.to_json() for e in reversed(dash.recent.requests)],
                   "errors": list(reversed(dash.recent.errors))},
    }


@routes.get("/v1/status")
async def get_status(request: Request, since: str | None = None) -> dict[str, Any]:
    """The fleet's numbers, plan, history and recent requests (docs/API.md)."""
    try:
        after = float(since or 0)
    except ValueError:
        raise ApiError(400, f"invalid 'since': a Unix time in seconds, e.g. 1733040000.5 (got {since!r:.40})",
                       param="since") from None
    return status(cast(Dashboard, request.app.state.dashboard), after)
