"""Several models behind one server: loaded on demand, unloaded by use, each loaded one with replicas of its own.

Every configured model is a :class:`ManagedModel`. While loaded it has its own
:class:`~llamafleet.fleet.replicas.ReplicaSet`, :class:`~llamafleet.fleet.router.Router` and
:class:`~llamafleet.fleet.dispatch.Dispatcher`, built from the plan placement gave it; the one-model server is the
same thing with one pinned model, placed before the server starts (:func:`placed_model`). The rules:

* **Pinned** models load at start and never unload; a request finds them loaded (or restarting: 503, as ever).
* Any other model loads on its **first request**. The request waits meanwhile, bounded twice: at most
  ``max_loading_queue`` requests wait for loads over all models (past that: :class:`ModelUnavailable`, a 503 with
  ``Retry-After``), and none waits past ``request_timeout_s``.
* Where a model goes is decided when it loads, by :func:`~llamafleet.placement.packing.evictions` over what is
  loaded now: models are unloaded, unpinned and least recently used first, until its plan fits; decisions are taken
  one at a time and reserve their memory at once, so two loads never count the same free memory. A model with
  requests waiting for it (just loaded, not yet serving them) is not chosen, so no load is wasted; when nothing can
  go now, the load waits for the next load, unload or served wait.
* An unloading model first finishes the requests it runs (up to ``request_timeout_s``; then they end with 503);
  requests that arrive meanwhile wait for its next load. Nothing in flight is dropped.
* A model idle (no request in flight) for its ``idle_ttl_s`` is unloaded.
* A model's replicas may include remote members (other servers, :mod:`llamafleet.fleet.remote`): they start and
  stop with its load and unload. A model served by remote members only places and loads nothing here: it is pinned,
  its dispatcher built up front (:func:`placed_model`).
* Loads of all models share one lock, so two loads never run on one GPU at once (concurrent CUDA context creation
  is a known crash), as the replicas of one model already did.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import KW_ONLY, dataclass, field

from llamafleet.config import FleetConfig
from llamafleet.fleet.dispatch import Dispatcher
from llamafleet.fleet.launch import Launcher, LoadError, ReplicaSpec
from llamafleet.fleet.relay import RemoteMember
from llamafleet.fleet.remote import member_specs, remote_context
from llamafleet.fleet.replicas import ReplicaSet
from llamafleet.fleet.router import Router
from llamafleet.fleet.specs import plan_specs
from llamafleet.fleet.telemetry import FleetMetrics, ModelState
from llamafleet.placement.gpus import Inventory
from llamafleet.placement.packing import Demand, Placed, evictions, usage
from llamafleet.placement.plan import Plan

log = logging.getLogger(__name__)

LOAD_RETRY_S = 5  # what a request refused while models load is told to wait
DRAIN_POLL_S = 0.05  # how often an unloading model checks whether its requests have finished
REAP_S = 1.0  # how often idle models are looked for
WORKER_EXIT_S = 10.0  # an unloaded model's workers get this long to exit before they are killed


class ModelUnavailable(RuntimeError):
    """The model cannot take a request now: a 503 with ``Retry-After``."""


class NotUnloadable(RuntimeError):
    """An unload that the model's configuration forbids (it is pinned)."""


@dataclass(eq=False)
class ManagedModel:
    """One configured model and, while loaded, the dispatcher in front of its replicas."""

    name: str
    _: KW_ONLY
    aliases: tuple[str, ...]
    pinned: bool
    idle_ttl_s: float | None
    n_ctx_per_seq: int  # its fixed shape's context per sequence, known before it loads
    demand: Demand | None = None  # what placement needs of it; None: its dispatcher is given, never rebuilt
    state: ModelState = "unloaded"
    dispatcher: Dispatcher | None = None
    placed: Placed | None = None  # memory it holds (reserved from the moment its load is decided)
    last_used: float = 0.0  # time.monotonic() of its last request (or of a running one, at the last look)
    failures: int = 0
    last_error: str | None = None
    waiting: int = 0  # requests waiting for it to load
    remote: list[RemoteMember] = field(default_factory=list)  # replicas that are other servers, after its own
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def reranker(self) -> bool:
        """Whether it scores query-document pairs: its header says so (known before it loads), or its replicas did."""
        if self.demand is not None:
            return self.demand.model.reranker
        return self.dispatcher is not None and self.dispatcher.reranker

    @property
    def where(self) -> list[str]:
        """Where its replicas run ("GPU 0", "GPUs 0,1", "CPU", "remote URL"); empty while it holds no memory."""
        if self.placed is not None:
            return [r.label for r in self.placed.plan.replicas] + [m.label for m in self.remote]
        return [spec.label for spec in self.dispatcher.replicas.specs] if self.dispatcher else []


def replica_prefix(model: str, several: bool) -> str:
    """What a model's replica labels in metrics and status start with: nothing for a lone model ("0"), its name with
    several ("chat/0")."""
    return f"{model}/" if several else ""


def new_dispatcher(specs: list[ReplicaSpec], cfg: FleetConfig, metrics: FleetMetrics | None, model: str,
                   load_lock: asyncio.Lock | None = None, replica_prefix: str = "",
                   launcher: Launcher | None = None) -> Dispatcher:
    """The replica set of ``specs`` behind a router and a dispatcher, as ``cfg`` sets them; ``replica_prefix``
    starts its replicas' metric labels ("" for a lone model, "chat/" for several); ``launcher`` starts its workers
    (default: child processes here)."""
    replicas = ReplicaSet(specs, cfg.log_level, cfg.heartbeat_timeout_s, load_lock, launcher, cfg.suspect_after_s)
    router = Router(len(specs), cfg.routing, cfg.max_queue_per_replica, cfg.max_queue)
    return Dispatcher(replicas, router, metrics, model=model, replica_prefix=replica_prefix)


def placed_model(name: str, specs: list[ReplicaSpec], n_ctx_per_seq: int, cfg: FleetConfig, metrics: FleetMetrics,
                 *, aliases: tuple[str, ...] = (), plan: Plan | None = None, launcher: Launcher | None = None,
                 replica_prefix: str = "") -> ManagedModel:
    """A model whose replicas are decided before the server starts: the one model of a one-model server (planned
    here, on a Ray cluster's nodes, or served by remote members), or a model of a fleet served by remote members only
    (nothing to place or load here). It is pinned, its dispatcher built now (``launcher`` starts its workers, default
    child processes here); ``plan``: where it was placed on this host, if it was."""
    dispatcher = new_dispatcher(specs, cfg, metrics, name, replica_prefix=replica_prefix, launcher=launcher)
    return ManagedModel(name, aliases=aliases, pinned=True, idle_ttl_s=None, n_ctx_per_seq=n_ctx_per_seq,
                        dispatcher=dispatcher, state="loading",
                        placed=None if plan is None else Placed(name, plan, usage(plan)))


def remote_only(name: str, aliases: tuple[str, ...], remote: list[RemoteMember], cfg: FleetConfig,
                metrics: FleetMetrics, replica_prefix: str = "") -> ManagedModel:
    """A model served by remote members only: always there, its members joining as their upstreams answer."""
    n_ctx = remote_context(cfg)
    return placed_model(name, member_specs(remote, n_ctx, f"{name} on "), n_ctx, cfg, metrics, aliases=aliases,
                        replica_prefix=replica_prefix)


def is_loaded(m: ManagedModel) -> bool:
    """Whether ``m`` is loaded (a function, so that type checkers do not take its state as fixed across awaits)."""
    return m.state == "loaded"


def in_flight(dispatcher: Dispatcher) -> int:
    """Sequences a model's replicas have been given and not finished."""
    router = dispatcher.router
    return sum(router.outstanding(r) for r in range(router.n_replicas))


class ModelManager:
    """The fleet's models: who is loaded, loads and unloads, and the wait of requests for a load."""

    def __init__(self, models: list[ManagedModel], cfg: FleetConfig, metrics: FleetMetrics,
                 inventory: Inventory | None = None, launcher: Launcher | None = None) -> None:
        """``launcher`` starts the workers of the models placed at load (default: child processes here)."""
        if not models:
            raise ValueError("a fleet needs at least one model")
        self.models = models
        self.cfg = cfg
        self.metrics = metrics
        self.inventory = inventory
        self.launcher = launcher
        self._names = {n: m for m in models for n in (m.name, *m.aliases)}
        self._changed = asyncio.Event()
        self._load_lock = asyncio.Lock()  # one load at a time on the whole machine
        self._waiting = 0
        self._reaper: asyncio.Task[None] | None = None

    @property
    def several(self) -> bool:
        return len(self.models) > 1

    def find(self, name: str) -> ManagedModel | None:
        """The model ``name`` (or an alias) names; None if none."""
        return self._names.get(name)

    def add(self, m: ManagedModel) -> None:
        """Serve one more model (a pulled one): unloaded, it loads on its first request. Its names must be new."""
        taken = [n for n in (m.name, *m.aliases) if n in self._names]
        if taken:
            raise ValueError(f"the fleet already has a model named {', '.join(taken)}")
        self.models.append(m)
        self._names |= {n: m for n in (m.name, *m.aliases)}
        self._notify()

    def loaded(self) -> list[ManagedModel]:
        """Models with replicas now (loading, loaded or unloading)."""
        return [m for m in self.models if m.dispatcher is not None]

    # -- life ---------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the pinned models, one after another; :class:`LoadError` if one fails (then call :meth:`stop`)."""
        self._reaper = asyncio.get_running_loop().create_task(self._reap_idle())
        for m in self.models:
            if m.pinned:
                self._begin_load(m)
                assert m.task is not None
                await m.task
                if m.state == "failed":
                    raise LoadError(m.last_error or f"model '{m.name}' failed to load")

    async def stop(self, timeout: float) -> None:
        """Stop every model's workers (see :meth:`ReplicaSet.stop`)."""
        for task in [self._reaper, *(m.task for m in self.models)]:
            if task is not None:
                task.cancel()
        for m in self.loaded():
            assert m.dispatcher is not None
            await m.dispatcher.replicas.stop(timeout)

    def abort_all(self, message: str) -> int:
        """End every running sequence of every model with a 503 ``message``; returns how many."""
        return sum(m.dispatcher.abort_all(message) for m in self.loaded() if m.dispatcher is not None)

    # -- requests -----------------------------------------------------------------------------------------------
    async def acquire(self, m: ManagedModel) -> None:
        """Return once ``m`` is loaded, loading it first if needed (the caller waits, bounded; see the module
        docstring); :class:`ModelUnavailable` if it cannot be. A pinned model is never waited for (while its
        replicas load or restart, its requests get the router's 503)."""
        if m.pinned or m.state == "loaded":
            m.last_used = time.monotonic()
            return
        if self._waiting >= self.cfg.max_loading_queue:
            self.metrics.refused.inc("loading_queue_full")
            raise ModelUnavailable(f"{self._waiting} request(s) already wait for models to load (max_loading_queue "
                                   f"{self.cfg.max_loading_queue}); retry after {LOAD_RETRY_S}s")
        self._waiting += 1
        m.waiting += 1
        try:
            async with asyncio.timeout(self.cfg.request_timeout_s):
                await self._loaded(m, f"; retry after {LOAD_RETRY_S}s")
        except TimeoutError:
            raise ModelUnavailable(f"model '{m.name}' did not load within {self.cfg.request_timeout_s:g}s "
                                   f"(request_timeout_s; now {m.state}); retry after {LOAD_RETRY_S}s") from None
        finally:
            self._waiting -= 1
            m.waiting -= 1
            if not m.waiting:
                self._notify()  # it may be unloaded now, if a load waits for room

    # -- admin --------------------------------------------------------------------------------------------------
    async def load(self, m: ManagedModel) -> None:
        """Load ``m`` now (if it is not) and wait for the outcome; :class:`ModelUnavailable` if it fails."""
        await self._loaded(m)

    async def _loaded(self, m: ManagedModel, advice: str = "") -> None:
        """Wait until ``m`` is loaded, starting its load when it is not loading; :class:`ModelUnavailable` if a
        load fails meanwhile (the message ends with ``advice``)."""
        failures = m.failures
        while not is_loaded(m):
            if m.failures > failures:
                raise ModelUnavailable(f"model '{m.name}' failed to load: {m.last_error}{advice}")
            if m.state in ("unloaded", "failed"):
                self._begin_load(m)
            await self._next_change()
        m.last_used = time.monotonic()

    async def unload(self, m: ManagedModel) -> None:
        """Unload ``m`` (after its running requests finish); :class:`NotUnloadable` if it is pinned."""
        if m.pinned:
            raise NotUnloadable(f"model '{m.name}' is pinned: it stays loaded (unpin it in the configuration)")
        while m.state in ("loading", "unloading"):
            await self._next_change()
        if m.state == "loaded":
            await self._begin_unload(m, "admin")

    # -- loading and unloading ----------------------------------------------------------------------------------
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _next_change(self) -> None:
        await self._changed.wait()

    def _begin_load(self, m: ManagedModel) -> None:
        m.state = "loading"
        m.task = asyncio.get_running_loop().create_task(self._load(m))
        self._notify()

    async def _load(self, m: ManagedModel) -> None:
        t0 = time.monotonic()
        try:
            if m.dispatcher is None:
                m.dispatcher = self._build(m, await self._reserve(m))
            await m.dispatcher.start()  # its replicas take the shared load lock, one at a time
        except Exception as e:  # a load that fails in any way must not leave the model "loading" for ever
            if isinstance(e, LoadError):
                log.error("model %s: %s", m.name, e)
            else:
                log.exception("model %s: loading failed", m.name)
            if m.dispatcher is not None:
                await m.dispatcher.replicas.stop(WORKER_EXIT_S)
            m.dispatcher, m.placed, m.state = (None if m.demand else m.dispatcher), None, "failed"
            m.failures, m.last_error = m.failures + 1, str(e)
            self.metrics.model_loads.inc(m.name, "failed")
        else:
            seconds = time.monotonic() - t0
            m.state, m.last_used = "loaded", time.monotonic()
            self.metrics.model_loads.inc(m.name, "loaded")
            self.metrics.model_load_seconds.observe(seconds, m.name)
            if self.several:
                log.info("model %s: loaded in %.1fs (%s)", m.name, seconds, ", ".join(m.where) or "CPU")
        finally:
            self._notify()

    async def _reserve(self, m: ManagedModel) -> Plan:
        """Decide where ``m`` goes, evicting what must go; wait while models that stay for now block it."""
        assert m.demand is not None and self.inventory is not None
        while True:
            held = [x.placed for x in self.models if x is not m and x.placed is not None]
            # requests that wait for a model just loaded are served before it can go: no load is wasted
            lru = [x.name for x in sorted(self.models, key=lambda x: x.last_used) if x.state == "loaded"
                   and not x.waiting]
            decision = evictions(m.demand, self.inventory, held, lru, {x.name for x in self.models if x.pinned})
            if decision.plan is not None:
                m.placed = Placed(m.name, decision.plan, usage(decision.plan))
                if decision.evict:
                    log.info("model %s: unloading %s (least recently used) to make room", m.name,
                             ", ".join(decision.evict))
                victims = [self._begin_unload(self._names[v], "lru") for v in decision.evict]
                await asyncio.gather(*victims)
                return decision.plan
            if decision.never:
                raise LoadError(decision.reason)
            log.info("model %s: waiting to load: %s", m.name, decision.reason)
            await self._next_change()

    def _begin_unload(self, m: ManagedModel, reason: str) -> asyncio.Task[None]:
        """Take ``m`` out of service now (new requests wait for its next load) and unload it in a task."""
        m.state = "unloading"
        self.metrics.model_evictions.inc(m.name, reason)
        self._notify()
        m.task = asyncio.get_running_loop().create_task(self._unload(m, reason))
        return m.task

    async def _unload(self, m: ManagedModel, reason: str) -> None:
        d = m.dispatcher
        try:
            if d is not None:
                deadline = time.monotonic() + self.cfg.request_timeout_s
                while in_flight(d) and time.monotonic() < deadline:
                    await asyncio.sleep(DRAIN_POLL_S)
                if in_flight(d):
                    d.abort_all(f"model '{m.name}' was unloaded while this request ran past request_timeout_s")
                await d.replicas.stop(WORKER_EXIT_S)
                self.metrics.retire(d.router)
            log.info("model %s: unloaded (%s)", m.name, {"lru": "to make room for another", "idle":
                     f"idle for {m.idle_ttl_s:g}s" if m.idle_ttl_s else "idle", "admin": "asked by an admin"}[reason])
        finally:
            m.dispatcher, m.placed, m.state = None, None, "unloaded"
            self._notify()

    def _build(self, m: ManagedModel, plan: Plan) -> Dispatcher:
        assert m.demand is not None
        specs = plan_specs(plan, m.demand.cfg, m.demand.model.path, f"{m.name} on ")
        specs += member_specs(m.remote, m.n_ctx_per_seq, f"{m.name} on ")
        return new_dispatcher(specs, self.cfg, self.metrics, m.name, self._load_lock,
                              replica_prefix=replica_prefix(m.name, self.several), launcher=self.launcher)

    async def _reap_idle(self) -> None:
        """Unload models idle past their ``idle_ttl_s``; a model with requests in flight counts as used now."""
        while True:
            await asyncio.sleep(REAP_S)
            now = time.monotonic()
            for m in self.models:
                if m.state != "loaded" or m.dispatcher is None:
                    continue
                if in_flight(m.dispatcher):
                    m.last_used = now  # a long request keeps its model recently used
                elif not m.pinned and m.idle_ttl_s is not None and now - m.last_used > m.idle_ttl_s:
                    self._begin_unload(m, "idle")
