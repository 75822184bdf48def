"""``GET /v1/status``: the fleet's numbers as one JSON document, for the dashboard (``/ui``) and for scripts.

The numbers are the ones ``GET /metrics`` exports, read from the same places (the workers' engine stats, the router,
the dispatcher's histograms, the watchdog's NVML scan), plus what a page needs and Prometheus text cannot carry: the
plan with its reasons, each device's memory as planned (weights / KV cache / compute buffers / margin) next to what
is measured, the last minutes of history (:mod:`llamafleet.fleet.history`) and the recent requests and errors
(:mod:`llamafleet.api.recent`). It needs an API key when keys are on, like every route but the probes.

Several models per server: every replica names its ``model`` and has an ``id``, the replica label ``/metrics`` uses
("0" for a lone model, "chat/0" for several); ``models`` lists every configured model with its state and replicas,
``plans`` has one plan per placed model and each device's ``planned`` one part per model placed on it.
``?since=T`` (Unix time) returns only the history samples taken after ``T``: a page that polls gets each sample once.
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
from llamafleet.api.admin import pull_card
from llamafleet.api.errors import ApiError
from llamafleet.api.middleware import tenant_of
from llamafleet.api.recent import RecentRequests
from llamafleet.api.service import Service
from llamafleet.fleet.history import INTERVAL_S, History, mean_of, utilization
from llamafleet.fleet.metrics import Counter
from llamafleet.fleet.pace import Pace
from llamafleet.fleet.snapshot import FleetSnapshot, ReplicaView
from llamafleet.fleet.telemetry import GpuSample
from llamafleet.fleet.tier_metrics import tier_json
from llamafleet.tenants.keys import Tenant

log = logging.getLogger(__name__)
routes = APIRouter()


class Dashboard:
    """What the status endpoint reads besides the service: the history ring and the recent requests and errors."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.history = History(service.metrics)
        self.recent = RecentRequests(service.config.recent_request_contents)
        self.pace = Pace()  # slow steps and an overloaded host, said in the log and in the warnings below
        self._stops: dict[str, tuple[int, str | None]] = {}  # replica label -> (restarts + hangs, last error) seen

    async def run(self) -> None:
        """Sample every :data:`~llamafleet.fleet.history.INTERVAL_S` until cancelled."""
        while True:
            try:
                self.sample()
            except Exception:  # a bug here must not end the history for the life of the server
                log.exception("the dashboard's sampler failed; its history has a gap")
            await asyncio.sleep(INTERVAL_S)

    def sample(self) -> None:
        snap = self.service.snapshot()
        self.history.sample(snap, time.time())
        self.pace.observe([(r.id, r.pid, r.stats) for r in snap.replicas()], time.monotonic())
        for r in snap.replicas():
            seen = (r.restarts + r.hangs, r.last_error)
            if r.last_error is not None and self._stops.get(r.id, (0, None)) != seen:
                self.recent.replica_error(r.id, r.last_error)
            self._stops[r.id] = seen


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


def _replica(r: ReplicaView, svc: Service, latest: dict[str, Any] | None) -> dict[str, Any]:
    m, stats = svc.metrics, r.stats
    cached = stats.prompt_tokens_cached_total if stats else 0
    computed = stats.prompt_tokens_total if stats else 0
    drafted, accepted = (stats.draft_tokens_total, stats.draft_accepted_total) if stats else (0, 0)
    sampled = next((x for x in latest["replicas"] if x["id"] == r.id), None) if latest else None
    return {
        "id": r.id, "index": r.index, "model": r.model, "where": r.where,
        "gpus": list(r.gpus), "status": r.status, "suspect": r.suspect, "pid": r.pid,
        "load_fraction": r.load_fraction, "restarts": r.restarts, "hangs": r.hangs, "suspicions": r.suspicions,
        "up_since": None if r.up_since is None else time.time() - (time.monotonic() - r.up_since),
        "slots": r.slots, "slots_busy": r.slots_busy, "waiting": r.waiting,
        "outstanding": r.outstanding, "queued": r.queued,
        "kv_tokens_used": stats.kv_tokens_used if stats else 0, "kv_tokens": stats.kv_tokens_total if stats else 0,
        "generated_tokens": r.generated_tokens,
        "prompt_tokens_computed": computed, "prompt_tokens_cached": cached,
        "cache_hit_rate": _ratio(cached, cached + computed),
        "draft_tokens": drafted, "draft_accepted_tokens": accepted, "draft_acceptance": _ratio(accepted, drafted),
        "graph_steps": stats.graph_steps_total if stats else 0,
        "tokens_per_s": sampled["tokens_per_s"] if sampled else 0.0,
        "ttft_s": mean_of(m.ttft, r.id), "itl_s": mean_of(m.token_gap, r.id),
        "memory_pss_bytes": _pss_bytes(r.pid), "last_error": r.last_error,
        "kv_tiers": tier_json(stats.tiers if stats else None),
    }


def _gpu_index(device: str) -> int | None:
    """The NVML index of a plan's device name ("GPU 3" -> 3; "CPU" -> None)."""
    return int(device.removeprefix("GPU ")) if device.startswith("GPU ") else None


def _devices(snap: FleetSnapshot, replicas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each device's memory: every placed model's parts (weights, KV cache, compute buffers, margin) and what is
    measured."""
    measured: dict[int, GpuSample] = {g.index: g for g in snap.gpus}
    devices: dict[str, dict[str, Any]] = {}
    for model in snap.models:
        if model.plan is None:
            continue
        on_model = [r for r in replicas if r["model"] == model.name]
        for b in model.plan.budgets:
            index = _gpu_index(b.device)
            d = devices.setdefault(b.device, {"device": b.device, "index": index, "name": b.name,
                                              "capacity_mib": b.capacity_mib, "planned": [], "measured": None})
            if b.replica is None:
                continue
            # a GPU's budget is its one replica's; the host's (a CPU plan) covers every replica on the CPU
            on_it = [r["id"] for r in on_model if (index in r["gpus"] if index is not None else not r["gpus"])]
            d["planned"].append({"model": model.name, "replicas": on_it, "weights_mib": b.weights_mib,
                                 "kv_mib": b.kv_mib, "compute_mib": b.compute_mib, "margin_mib": b.margin_mib})
    for g in snap.gpus:  # a GPU no plan lists (planned elsewhere, or no plan): measured only
        devices.setdefault(f"GPU {g.index}", {"device": f"GPU {g.index}", "index": g.index, "name": g.name,
                                              "capacity_mib": None, "planned": [], "measured": None})
    for d in devices.values():
        if d["index"] is not None and d["index"] in measured:
            g = measured[d["index"]]
            d["measured"] = {"used_bytes": g.used_bytes, "total_bytes": g.total_bytes, "utilization": utilization(g)}
        elif d["index"] is None:  # the host: what the workers hold, shared pages counted once
            pss = [r["memory_pss_bytes"] for r in replicas if r["memory_pss_bytes"] is not None]
            d["measured"] = {"used_bytes": sum(pss), "total_bytes": None, "utilization": None} if pss else None
    return list(devices.values())


def _totals(svc: Service, snap: FleetSnapshot, replicas: list[dict[str, Any]],
            latest: dict[str, Any] | None) -> dict[str, Any]:
    m = svc.metrics
    labels = [r["id"] for r in replicas]
    prompt, cached = m.prompt_tokens.total(), m.prompt_cached.total()

    def pooled(h: Any) -> float | None:
        n = sum(h.count(i) for i in labels)
        return sum(h.total(i) for i in labels) / n if n else None

    return {
        "http_requests": m.http_requests.total(), "queue_depth": snap.queue_depth(),
        "prompt_tokens": prompt, "prompt_tokens_cached": cached, "generated_tokens": m.generated_tokens.total(),
        "cache_hit_rate": _ratio(cached, prompt),
        "draft_tokens": m.draft_tokens.total(), "draft_accepted_tokens": m.draft_accepted.total(),
        "draft_acceptance": _ratio(m.draft_accepted.total(), m.draft_tokens.total()),
        "tokens_per_s": latest["tokens_per_s"] if latest else 0.0,
        "ttft_s": pooled(m.ttft), "itl_s": pooled(m.token_gap),
        "sequences": _labelled(m.sequences), "refused": _labelled(m.refused),
        "routing": dict(snap.decisions()),
    }


def status(dash: Dashboard, since: float, viewer: Tenant | None = None) -> dict[str, Any]:
    """The whole document; see the module docstring and docs/API.md. ``viewer``: the caller's key (None: keys are
    off); a key without the admin scope sees only its own usage."""
    svc = dash.service
    snap = svc.snapshot()
    samples = dash.history.samples
    latest = samples[-1] if samples else None
    replicas = [_replica(r, svc, latest) for r in snap.replicas()]
    return {
        "version": __version__, "time": time.time(), "started": svc.created, "pid": os.getpid(),
        "status": snap.readiness(svc.loaded), "overloaded": snap.overloaded, "warnings": dash.pace.warnings(),
        "models": [{"name": m.name, "state": m.state, "pinned": m.pinned, "n_ctx_per_seq": m.n_ctx_per_seq,
                    "replicas": [r.id for r in m.replicas]} for m in snap.models],
        "downloads": [pull_card(svc, p).model_dump(include={"id", "state", "download", "last_error"})
                      for p in svc.pulls.active.values()],
        "totals": _totals(svc, snap, replicas, latest),
        "replicas": replicas,
        "devices": _devices(snap, replicas),
        "plans": [m.plan.to_json() | {"model": m.name} for m in snap.models if m.plan is not None],
        "history": {"interval_s": dash.history.interval_s, "span_s": dash.history.span_s,
                    "samples": dash.history.since(since)},
        "keys": _keys_today(svc, viewer),
        "recent": {"contents": dash.recent.contents,
                   "requests": [e.to_json() for e in reversed(dash.recent.requests)],
                   "errors": list(reversed(dash.recent.errors))},
    }


def _keys_today(svc: Service, viewer: Tenant | None) -> list[dict[str, int | str]]:
    """Today's usage of every key (of the viewer's own only, unless it has the admin scope)."""
    rows = svc.tenancy.usage.report(None if viewer is None or "admin" in viewer.scopes else viewer.name)
    today = time.strftime("%Y-%m-%d", time.gmtime())
    return [r for r in rows if r["day"] == today]


@routes.get("/v1/status")
async def get_status(request: Request, since: str | None = None) -> dict[str, Any]:
    """The fleet's numbers, plan, history and recent requests (docs/API.md)."""
    try:
        after = float(since or 0)
    except ValueError:
        raise ApiError(400, f"invalid 'since': a Unix time in seconds, e.g. 1733040000.5 (got {since!r:.40})",
                       param="since") from None
    return status(cast(Dashboard, request.app.state.dashboard), after, tenant_of(request.scope))
