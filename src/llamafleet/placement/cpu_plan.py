"""Host memory in a plan: the replicas of a CPU plan, and the RAM tier of the KV cache that every plan sizes from the
host memory it leaves (:mod:`llamafleet.engine.kv_tiers`)."""

from __future__ import annotations

from dataclasses import replace

from llamafleet.config import FleetConfig
from llamafleet.model.header import ModelInfo
from llamafleet.placement.advice import how_to_fit, mib
from llamafleet.placement.draft import Notes, to_plan
from llamafleet.placement.gpus import Inventory
from llamafleet.placement.memory import MIB, ContextShape, replica_needs
from llamafleet.placement.plan import Budget, Plan, ReplicaPlan

KV_TIER_MAX_MIB = 8192  # the RAM tier's default bound per replica (llama-server's --cache-ram default)
KV_TIER_UNKNOWN_MIB = 1024  # ... when the host's memory is unknown


def cpu_plan(model: ModelInfo, inv: Inventory, cfg: FleetConfig, ctx: ContextShape, notes: Notes, why: str) -> Plan:
    """``replicas`` (default 1) on the CPU, checked against the host's memory; ``why``: why not on GPUs."""
    n = cfg.replicas or 1
    _, host = replica_needs(model, ctx, "none", ())
    copies = n if model.engine == "torch" else 1  # llama.cpp's replicas share one mapping; torch's each load theirs
    budget = Budget(device="CPU", name="host memory", replica=0, weights_mib=mib(host.weights * copies),
                    kv_mib=mib(host.kv * n), compute_mib=mib(host.compute * n), margin_mib=cfg.vram_margin_mib,
                    capacity_mib=inv.host_mem_mib)
    tier = 0 if model.engine == "torch" else kv_tier_mib(
        cfg, None if inv.host_mem_mib is None else inv.host_mem_mib - budget.used_mib, n, notes)
    budget = replace(budget, kv_tier_mib=tier * n)
    notes.reasons.append(f"CPU plan ({why}): {n} replica(s) on the CPU "
                         + ("each with its own copy of the weights (torch engine)" if model.engine == "torch"
                            else "sharing one mapping of the weights"))
    if budget.capacity_mib is None:
        notes.warnings.append("available RAM is unknown; memory was not checked")
    fits = budget.overflow_mib == 0
    if not fits:
        notes.reasons.append(f"needs {budget.used_mib} MiB of RAM but {budget.capacity_mib} MiB are available "
                             f"(over by {budget.overflow_mib} MiB)")
        notes.reasons.extend(how_to_fit(model, ctx, cfg, [((budget.capacity_mib or 0) - cfg.vram_margin_mib) * MIB],
                                         n, host=True))
    replicas = tuple(ReplicaPlan(gpus=(), split_mode="none", tensor_split=(), main_gpu=-1) for _ in range(n))
    return replace(to_plan(model=model, ctx=ctx, cfg=cfg, notes=notes, device="cpu", fits=fits, replicas=replicas,
                         budgets=(budget,)), kv_tier_mib=tier)


def kv_tier_mib(cfg: FleetConfig, free_mib: int | None, n: int, notes: Notes) -> int:
    """The RAM tier of the KV cache per replica: ``cache_ram_mib``, or unset, a quarter of the host memory
    (``free_mib``) the plan leaves, shared by its ``n`` replicas, at most :data:`KV_TIER_MAX_MIB` each (1024 when
    the memory is unknown). Off without the prefix cache. On GPUs too: where copying a state to host memory is
    slower than prefilling it again (a fast GPU, docs/BENCHMARKS.md run 12), the engine measures that and stops
    saving (engine/kv_cost.py)."""
    if not cfg.prefix_cache:
        return 0
    if cfg.cache_ram_mib is not None:
        if free_mib is not None and cfg.cache_ram_mib * n > free_mib:
            notes.warnings.append(f"cache_ram_mib {cfg.cache_ram_mib} x {n} replica(s) is more than the "
                                  f"{max(0, free_mib)} MiB of RAM the plan leaves: lower cache_ram_mib")
        return cfg.cache_ram_mib
    tier = KV_TIER_UNKNOWN_MIB if free_mib is None else min(KV_TIER_MAX_MIB, max(0, free_mib) // 4 // max(1, n))
    notes.reasons.append(f"KV cache RAM tier: {tier} MiB per replica (cache_ram_mib); states are copied there only "
                         "while that is measured to cost less than prefilling them again")
    return tier
