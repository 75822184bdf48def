"""Several models on one machine's GPUs: which are resident together, which swap, and what a load must evict.

Pure logic over :func:`~llamafleet.placement.planner.make_plan`, which already proves one model fits given free
memory per GPU. Packing N models is planning each on what the others leave (:func:`residual`):

1. **Shape first** (:func:`fix_shape`): pinned models are planned in order, each on what the pinned ones before it
   leave; every other model on what all the pinned models leave, so the planner's auto-fit picks its slots and
   context as if it were the only unpinned one. That shape is then fixed: a model never shrinks because others
   happen to be loaded, and it can always load once unpinned models make room. A model that does not fit beside
   the pinned ones can never load, and the fleet is refused with the planner's reasons.
2. **Resident set** (:func:`pack`): the pinned models, then the rest in configuration order, each planned on the
   memory the ones before it leave. What does not fit is *swapped*: loaded on demand, evicting others.
3. **Evictions** (:func:`evictions`): for a model to load while others are loaded, unload unpinned models, least
   recently used first, until its plan fits what is left; or say why it never can (pinned models and loads in
   progress are never evicted).

The margin (``vram_margin_mib``) is kept once per *worker process* on a GPU: each model's replicas are processes of
their own, and each holds its own CUDA context, cuBLAS workspace and memory pool, which is what the margin covers
(measured on an H200 with a 7B Q4_0 replica: 1,136 MiB beyond its weights, KV cache and compute buffers; see
docs/BENCHMARKS.md, run 10). So a residual GPU's free memory loses what placed replicas use (weights, KV cache,
compute buffers) and their margin, and each plan adds its own margin on top. On the CPU a resident model takes only
its parts from ``host_mem_mib`` and the margin is kept once (unknown RAM: nothing is checked, nothing swaps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from llamafleet.config import FleetConfig
from llamafleet.model.header import ModelInfo
from llamafleet.placement.gpus import Inventory
from llamafleet.placement.plan import Plan
from llamafleet.placement.planner import make_plan

HOST = -1  # the device key of host memory in a usage map


@dataclass(frozen=True)
class Demand:
    """One model to place: its name, header, configuration (shape fixed by :func:`fix_shape`) and whether pinned."""

    name: str
    model: ModelInfo
    cfg: FleetConfig
    pinned: bool = False


@dataclass(frozen=True)
class Placed:
    """A model placed (or loaded): its plan and the MiB it uses per device (GPU index, or :data:`HOST`)."""

    name: str
    plan: Plan
    usage: Mapping[int, int]


@dataclass(frozen=True)
class Packing:
    """The placement of a fleet: the resident set, the models that swap, those that never fit, and why."""

    fits: bool  # every pinned model fits together and every model fits the machine alone
    resident: tuple[Placed, ...]
    swapped: tuple[str, ...]  # fit alone but not beside the resident set: loaded on demand
    shapes: Mapping[str, Plan]  # each model's plan on the machine less the pinned models: the shape it loads with
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Eviction:
    """What loading a model takes: the models to unload first (LRU order) and its plan; or why it cannot load."""

    plan: Plan | None  # None: cannot load now (see reason)
    evict: tuple[str, ...]
    reason: str = ""
    never: bool = False  # even with every evictable model gone it would not fit


def usage(plan: Plan) -> dict[int, int]:
    """MiB a fitting plan holds per device: per GPU its replicas' parts and the margin of their worker process (see
    the module docstring); on :data:`HOST` the parts."""
    out: dict[int, int] = {}
    for b in plan.budgets:
        if b.replica is None and plan.device == "gpu":
            continue
        key = HOST if plan.device == "cpu" else int(b.device.removeprefix("GPU "))
        own = b.margin_mib if plan.device == "gpu" else 0
        out[key] = out.get(key, 0) + b.weights_mib + b.kv_mib + b.compute_mib + own
    return out


def residual(inventory: Inventory, placed: Sequence[Placed]) -> Inventory:
    """``inventory`` with what ``placed`` use taken off each device's free memory."""
    used: dict[int, int] = {}
    for p in placed:
        for dev, n in p.usage.items():
            used[dev] = used.get(dev, 0) + n
    gpus = tuple(replace(g, free_mib=max(0, g.free_mib - used.get(g.index, 0))) for g in inventory.gpus)
    host = inventory.host_mem_mib
    if host is not None:
        host = max(0, host - used.get(HOST, 0))
    return replace(inventory, gpus=gpus, host_mem_mib=host)


def fix_shape(model: ModelInfo, inventory: Inventory, cfg: FleetConfig) -> tuple[Plan, FleetConfig]:
    """The model's plan alone on ``inventory`` and ``cfg`` with the slots and context it chose set explicitly."""
    alone = make_plan(model, inventory, cfg)
    return alone, cfg.model_copy(update={"parallel": alone.n_seq, "context_length": alone.n_ctx_per_seq})


def place(demand: Demand, inventory: Inventory, placed: Sequence[Placed]) -> Placed | None:
    """``demand`` planned on what ``placed`` leave of ``inventory``; None if it does not fit there."""
    plan = make_plan(demand.model, residual(inventory, placed), demand.cfg)
    return Placed(demand.name, plan, usage(plan)) if plan.fits else None


def pack(demands: Sequence[Demand], inventory: Inventory) -> tuple[Packing, list[Demand]]:
    """Place a fleet (see the module docstring); also returns the demands with their shapes fixed."""
    resident: list[Placed] = []
    shapes: dict[str, Plan] = {}
    fixed: dict[str, Demand] = {}
    reasons, swapped = [], []
    for d in sorted(demands, key=lambda d: not d.pinned):  # stable: pinned first, each group in config order
        pinned = [p for p in resident if p.name in fixed and fixed[p.name].pinned]
        plan, cfg = fix_shape(d.model, residual(inventory, pinned), d.cfg)
        shapes[d.name], fixed[d.name] = plan, replace(d, cfg=cfg)
        if not plan.fits:
            where = f"beside the pinned models ({', '.join(p.name for p in pinned)})" if pinned else "even alone"
            reasons.append(f"{d.name} does not fit this machine {where}: " + "; ".join(plan.reasons[1:]))
            continue
        p = Placed(d.name, plan, usage(plan)) if d.pinned else place(fixed[d.name], inventory, resident)
        if p is not None:
            resident.append(p)
        else:
            swapped.append(d.name)
    packing = Packing(not reasons, tuple(resident), tuple(swapped), shapes, tuple(reasons))
    return packing, [fixed[d.name] for d in demands]


def evictions(demand: Demand, inventory: Inventory, loaded: Sequence[Placed], lru: Sequence[str],
              pinned: frozenset[str] | set[str] = frozenset()) -> Eviction:
    """What must be unloaded, least recently used first, for ``demand`` to load beside ``loaded``.

    ``lru`` orders the evictable loaded models from least to most recently used; a loaded model not in it (one
    loading, or serving a request the caller will not cut) stays, and so does every name in ``pinned``. With
    nothing left to evict, the answer says whether the model can never load beside the pinned models (``never``)
    or must wait for the models that stay now.
    """
    candidates = [n for n in lru if n not in pinned and any(p.name == n for p in loaded)]
    staying = list(loaded)
    evict: list[str] = []
    while True:
        plan = make_plan(demand.model, residual(inventory, staying), demand.cfg)
        if plan.fits:
            return Eviction(plan, tuple(evict))
        if not candidates:
            break
        victim = candidates.pop(0)
        evict.append(victim)
        staying = [p for p in staying if p.name != victim]
    fixed = [p for p in staying if p.name in pinned]
    if not make_plan(demand.model, residual(inventory, fixed), demand.cfg).fits:
        beside = f"beside the pinned models ({', '.join(p.name for p in fixed)})" if fixed else "even alone"
        return Eviction(None, (), f"{demand.name} does not fit this machine {beside}; see `llamafleet plan`",
                        never=True)
    busy = ", ".join(p.name for p in staying if p.name not in pinned)
    return Eviction(None, (), f"{demand.name} does not fit until {busy} can be unloaded (loading or in use)")


def swaps(packing: Packing, demands: Sequence[Demand], inventory: Inventory) -> dict[str, Eviction]:
    """For each swapped model, what loading it right after start evicts (the start order as the LRU order)."""
    pinned = {d.name for d in demands if d.pinned}
    lru = [p.name for p in packing.resident if p.name not in pinned]
    return {d.name: evictions(d, inventory, packing.resident, lru, pinned)
            for d in demands if d.name in packing.swapped}


@dataclass(frozen=True)
class DeviceUse:
    """One device under a packing: free memory, the margin kept, MiB per resident model (on a GPU with the margin of
    its process), what is left (MiB)."""

    device: str  # "GPU 0" or "CPU"
    free_mib: int | None  # None: unknown (CPU without a known RAM size)
    margin_mib: int
    models: Mapping[str, int]

    @property
    def left_mib(self) -> int | None:
        once = self.margin_mib if self.models and self.device == "CPU" else 0  # on GPUs: in each model's MiB
        used = sum(self.models.values()) + once
        return None if self.free_mib is None else self.free_mib - used


def device_use(packing: Packing, inventory: Inventory, margin_mib: int) -> list[DeviceUse]:
    """The per-device budget of the resident set: one row per GPU (or one for the CPU)."""
    devices: list[tuple[int, str, int | None]] = [(g.index, f"GPU {g.index}", g.free_mib) for g in inventory.gpus]
    if not devices or any(HOST in p.usage for p in packing.resident):
        devices.append((HOST, "CPU", inventory.host_mem_mib))
    return [DeviceUse(label, free, margin_mib, {p.name: p.usage[key] for p in packing.resident if key in p.usage})
            for key, label, free in devices]
