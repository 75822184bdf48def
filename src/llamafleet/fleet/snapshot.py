"""One read-only picture of the fleet, for everything that reports on it or watches it.

``/ready``, ``/metrics``, ``/v1/status``, ``/v1/models``, the dashboard's history and the watchdog all read a
:class:`FleetSnapshot` (:func:`take`) instead of walking the replica sets and routers themselves: per model, its state
and placement; per replica of a model that has replicas now, its status (suspect or not), slots, queue, outstanding
sequences, pid, GPUs, restarts, hangs, last error and last engine stats. Taking one reads only what is in memory (a
few small objects per replica, no I/O), and copies it: what a caller holds does not change under it.

:func:`publish` copies a snapshot into the gauges of :class:`~llamafleet.fleet.telemetry.FleetMetrics` just before
``GET /metrics`` renders them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from llamafleet.engine.types import EngineStats
from llamafleet.fleet.models import ManagedModel, ModelManager
from llamafleet.fleet.replicas import ReplicaStatus
from llamafleet.fleet.telemetry import MODEL_STATES, FleetMetrics, GpuSample, ModelState
from llamafleet.placement.plan import Plan


@dataclass(frozen=True, kw_only=True)
class ReplicaView:
    """One replica of one model, as supervision and the router know it now."""

    id: str  # its label in metrics and status: "0" for a lone model, "chat/0" with several
    index: int
    model: str
    where: str  # "CPU", "GPU 0", ...
    status: ReplicaStatus
    gpus: tuple[int, ...] = ()
    suspect: bool = False
    pid: int | None = None
    restarts: int = 0
    hangs: int = 0
    suspicions: int = 0
    load_fraction: float = 0.0
    slots: int | None = None
    up_since: float | None = None  # time.monotonic()
    last_error: str | None = None
    stats: EngineStats | None = None  # the engine's, from its last step outputs
    outstanding: int = 0  # sequences routed there and not finished
    queued: int = 0  # of those, beyond its slots

    @property
    def slots_busy(self) -> int:
        return self.stats.slots_busy if self.stats else 0

    @property
    def waiting(self) -> int:
        """Sequences inside its engine waiting for a slot."""
        return self.stats.waiting if self.stats else 0

    @property
    def generated_tokens(self) -> int:
        return self.stats.generated_tokens_total if self.stats else 0


@dataclass(frozen=True, kw_only=True)
class ModelView:
    """One configured model; ``replicas`` is empty while it has none (unloaded, failed)."""

    name: str
    aliases: tuple[str, ...]
    state: ModelState
    pinned: bool
    n_ctx_per_seq: int
    waiting: int  # requests waiting for it to load
    where: tuple[str, ...]
    last_error: str | None
    plan: Plan | None  # where placement put it (None: not placed here)
    prefix: str  # of its replicas' labels: "" for a lone model, "chat/" with several
    replicas: tuple[ReplicaView, ...]
    decisions: Counter[str] = field(default_factory=Counter)  # its router's routing decisions
    queue_depth: int = 0

    @property
    def load_progress(self) -> float:
        """The fraction of its replicas' weights loaded (a ready replica counts whole)."""
        if not self.replicas:
            return 0.0
        return sum(1.0 if r.status == "ready" else r.load_fraction for r in self.replicas) / len(self.replicas)

    @property
    def serving(self) -> bool:
        """A replica of it is up."""
        return any(r.status == "ready" for r in self.replicas)

    @property
    def all_up(self) -> bool:
        """It has replicas, and every one is up and not suspect."""
        return bool(self.replicas) and all(r.status == "ready" and not r.suspect for r in self.replicas)


@dataclass(frozen=True)
class FleetSnapshot:
    """Every model, the GPUs as last sampled, and why new work is refused (None: it is not)."""

    models: tuple[ModelView, ...]
    gpus: tuple[GpuSample, ...] = ()
    overloaded: str | None = None

    def replicas(self) -> list[ReplicaView]:
        """Every replica of every model that has replicas now, model by model."""
        return [r for m in self.models for r in m.replicas]

    def model(self, name: str) -> ModelView:
        return next(m for m in self.models if m.name == name)

    def queue_depth(self) -> int:
        return sum(m.queue_depth for m in self.models)

    def decisions(self) -> Counter[str]:
        """Routing decisions of the models that have replicas now."""
        return sum((m.decisions for m in self.models), Counter())

    def readiness(self, loaded: bool) -> str:
        """``loading`` (the first load, ``loaded`` False), ``overloaded`` (GPU memory), ``ready`` (every replica of
        every pinned or loaded model is up), ``degraded`` (requests are served, not by every replica), ``down``
        (none are). Requests are served when a replica of a pinned model is up; with none pinned, models load on
        demand."""
        pinned = [m for m in self.models if m.pinned]
        serving = any(m.serving for m in pinned) or not pinned
        all_up = all(m.all_up for m in self.models if m.pinned or m.state == "loaded")
        return ("loading" if not loaded else "overloaded" if self.overloaded is not None
                else "ready" if serving and all_up else "degraded" if serving else "down")


def take(models: ModelManager, gpus: Iterable[GpuSample] = (), overloaded: str | None = None) -> FleetSnapshot:
    """The fleet now."""
    return FleetSnapshot(tuple(_model(m) for m in models.models), tuple(gpus), overloaded)


def _model(m: ManagedModel) -> ModelView:
    d = m.dispatcher
    replicas: tuple[ReplicaView, ...] = ()
    if d is not None:
        router, specs = d.router, d.replicas.specs
        replicas = tuple(ReplicaView(
            id=f"{d.replica_prefix}{st.index}", index=st.index, model=m.name, where=st.label,
            gpus=specs[st.index].gpus, status=st.status, suspect=st.suspect, pid=st.pid, restarts=st.restarts,
            hangs=st.hangs, suspicions=st.suspicions, load_fraction=st.load_fraction, slots=st.slots,
            up_since=st.up_since, last_error=st.last_error, stats=st.stats, outstanding=router.outstanding(st.index),
            queued=router.queued(st.index)) for st in d.replicas.states)
    return ModelView(name=m.name, aliases=m.aliases, state=m.state, pinned=m.pinned, n_ctx_per_seq=m.n_ctx_per_seq,
                     waiting=m.waiting, where=tuple(m.where), last_error=m.last_error,
                     plan=None if m.placed is None else m.placed.plan, prefix=d.replica_prefix if d else "",
                     replicas=replicas, decisions=Counter(d.router.decisions) if d else Counter(),
                     queue_depth=d.router.queue_depth() if d else 0)


def publish(snap: FleetSnapshot, metrics: FleetMetrics) -> None:
    """Copy ``snap``'s replica, queue, model and GPU state into ``metrics``' gauges."""
    m = metrics
    for g in (m.outstanding, m.replica_up, m.slots_total, m.slots_busy, m.engine_waiting, m.kv_used, m.kv_total,
              m.gpu_used, m.gpu_total, m.gpu_util):
        g.clear()
    for r in snap.replicas():
        m.replica_up.set(1 if r.status == "ready" else 0, r.id, r.where)
        m.outstanding.set(r.outstanding, r.id)
        m.restarts.set_total(r.restarts, r.id)
        m.hangs.set_total(r.hangs, r.id)
        m.suspicions.set_total(r.suspicions, r.id)
        if r.slots is not None:
            m.slots_total.set(r.slots, r.id)
        m.slots_busy.set(r.slots_busy, r.id)
        m.engine_waiting.set(r.waiting, r.id)
        m.kv_used.set(r.stats.kv_tokens_used if r.stats else 0, r.id)
        if r.stats:
            m.kv_total.set(r.stats.kv_tokens_total, r.id)
            m.count_steps(r.id, r.pid, r.stats.steps)
            m.kv_tiers.refresh(r.id, r.pid, r.stats.tiers)
    m.queue_depth.set(snap.queue_depth())
    for reason, n in (m.retired + snap.decisions()).items():
        m.routing.set_total(n, reason)
    m.overloaded.set(1 if snap.overloaded is not None else 0)
    for gpu in snap.gpus:
        labels = (str(gpu.index), gpu.name)
        m.gpu_used.set(gpu.used_bytes, *labels)
        m.gpu_total.set(gpu.total_bytes, *labels)
        if gpu.utilization_pct is not None:
            m.gpu_util.set(gpu.utilization_pct / 100, *labels)
    for model in snap.models:
        for s in MODEL_STATES:
            m.model_state.set(1 if s == model.state else 0, model.name, s)
        m.model_load_waiting.set(model.waiting, model.name)
        m.model_queue_depth.set(model.queue_depth, model.name)
