"""Placing a model on this host's GPUs: one replica per GPU when one holds it (data parallel), else groups of the
fewest GPUs that hold it (tensor split where every pair is NVLinked, layer split otherwise; the torch engine's always
by layer), explicit choices checked, and each device's budget. The policy is :mod:`llamafleet.placement.planner`'s."""

from __future__ import annotations

from dataclasses import replace

from llamafleet.config import FleetConfig
from llamafleet.engine.types import SplitModeName
from llamafleet.model.header import ModelInfo
from llamafleet.placement.advice import how_to_fit, mib, park_room, ratio_warning
from llamafleet.placement.cpu_plan import kv_tier_mib
from llamafleet.placement.draft import Candidate, Notes, balance, normalize, to_plan
from llamafleet.placement.gpus import Gpu, Inventory
from llamafleet.placement.memory import MIB, ContextShape, DeviceNeed, replica_needs
from llamafleet.placement.plan import Budget, Plan, ReplicaPlan


def gpu_plan(model: ModelInfo, inv: Inventory, gpus: tuple[Gpu, ...], cfg: FleetConfig, ctx: ContextShape,
             notes: Notes) -> Plan:
    """The plan on ``gpus`` (this host's, as ``cfg`` selects them), with ``notes``' reasons so far."""
    margin = cfg.vram_margin_mib * MIB
    (one,), host = replica_needs(model, ctx, "none", (1.0,), cfg.n_gpu_layers)
    holders = [g for g in gpus if one.total + margin <= g.free_mib * MIB]
    linked = len(gpus) > 1 and inv.all_linked(tuple(g.index for g in gpus), "nvlink")
    explicit = cfg.split_mode in ("layer", "tensor") or cfg.split_ratio is not None
    latency = (cfg.prefer == "latency" and linked and cfg.replicas is None and cfg.flash_attn is not False
               and model.engine != "torch")
    if cfg.split_mode == "none" or (not explicit and holders and not latency):
        if cfg.split_ratio is not None:
            notes.warnings.append("split_ratio is ignored: split_mode none keeps each replica on one GPU")
        groups = _data_parallel(model, gpus, holders, one, cfg, notes)
    else:
        groups = _split(model, inv, gpus, cfg, ctx, notes, latency)
    if cfg.main_gpu is not None and all(cfg.main_gpu not in (x.index for x in g.gpus) for g in groups):
        notes.warnings.append(f"main_gpu {cfg.main_gpu} is not used by this plan")
    for gpu, over in (x for g in groups for x in g.overflows(margin)):
        notes.reasons.append(f"GPU {gpu.index} overflows by {mib(over)} MiB (needs {mib(over) + gpu.free_mib} MiB "
                             f"with the {cfg.vram_margin_mib} MiB margin, has {gpu.free_mib} MiB free)")
    fits = bool(groups) and not notes.refused and all(not g.overflows(margin) for g in groups)
    if not fits and not notes.refused:
        usable = [g.free_mib * MIB - margin for g in gpus]
        usable = [max(usable)] if cfg.split_mode == "none" else usable
        notes.reasons.extend(how_to_fit(model, ctx, cfg, usable, max(1, len(groups)), host=False))
    replicas, budgets = _layout(groups, gpus, cfg)
    if fits and cfg.prefix_cache and model.engine != "torch" and (room := park_room(model, ctx, budgets)):
        notes.reasons.append(room)
    n = max(1, len(groups))
    free = None if inv.host_mem_mib is None else inv.host_mem_mib - mib(host.total) * n
    tier = 0 if model.engine == "torch" else kv_tier_mib(cfg, free, n, notes)
    return replace(to_plan(model=model, ctx=ctx, cfg=cfg, notes=notes, device="gpu", fits=fits, replicas=replicas,
                         budgets=budgets, host=host.total), kv_tier_mib=tier)


def _data_parallel(model: ModelInfo, gpus: tuple[Gpu, ...], holders: list[Gpu], one: DeviceNeed, cfg: FleetConfig,
                   notes: Notes) -> list[Candidate]:
    need = mib(one.total) + cfg.vram_margin_mib
    if not holders:
        best = max(gpus, key=lambda g: g.free_mib)
        notes.reasons.append(f"split_mode none keeps each replica on one GPU, and none holds one ({need} MiB); "
                             "split_mode: auto would split it over several GPUs")
        return [Candidate((best,), "none", (), (one,))]
    # main_gpu first when it can hold a replica, then the GPUs with the most free memory.
    order = sorted(holders, key=lambda g: (g.index != cfg.main_gpu, -g.free_mib, g.index))
    n = cfg.replicas or len(order)
    if n > len(order):
        notes.refuse(f"replicas: {n} needs {n} GPUs that each hold the model ({need} MiB), but only "
                     f"{len(order)} can: lower replicas, or raise parallel for more slots per replica")
        return [Candidate((g,), "none", (), (one,)) for g in sorted(order, key=lambda g: g.index)]
    chosen = order[:n]
    notes.reasons.append(f"the model with its KV cache and buffers needs {need} MiB, which fits one GPU: "
                         f"{n} replica(s), one per GPU (data parallel, the fastest way to use several GPUs)")
    for g in gpus:
        if g not in holders:
            notes.warnings.append(f"GPU {g.index} ({g.name}, {g.free_mib} MiB free) cannot hold a replica "
                                  f"({need} MiB); it stays unused")
        elif g not in chosen:
            notes.warnings.append(f"GPU {g.index} stays unused (replicas: {n})")
    return [Candidate((g,), "none", (), (one,)) for g in sorted(chosen, key=lambda g: g.index)]


def _split(model: ModelInfo, inv: Inventory, gpus: tuple[Gpu, ...], cfg: FleetConfig, ctx: ContextShape,
           notes: Notes, latency: bool) -> list[Candidate]:
    margin = cfg.vram_margin_mib * MIB
    k: int | None = None
    if cfg.split_ratio is not None:
        k = len(cfg.split_ratio)
        if k > len(gpus):
            notes.refuse(f"split_ratio has {k} entries but only {len(gpus)} GPU(s) are selected: "
                         "give one share per GPU")
            return []
    elif cfg.replicas is not None:
        if cfg.replicas > len(gpus):
            notes.refuse(f"replicas: {cfg.replicas} exceeds the {len(gpus)} selected GPU(s), and the "
                         "model does not fit one GPU; lower replicas")
            return []
        k = len(gpus) // cfg.replicas
    elif latency:
        k = len(gpus)

    def groups_of(size: int) -> list[Candidate]:
        return [_fit_group(model, inv, members, cfg, ctx) for members in _partition(inv, gpus, size)]

    if k is not None:
        groups = groups_of(k)[: cfg.replicas] if cfg.replicas is not None else groups_of(k)
    else:  # the fewest GPUs per replica that hold the model; as many such replicas as fit
        first = 2 if cfg.split_mode in ("layer", "tensor") and len(gpus) > 1 else 1
        groups = groups_of(len(gpus))
        for size in range(first, len(gpus) + 1):
            fitting = [g for g in groups_of(size) if not g.overflows(margin)]
            if fitting:
                groups = fitting
                break
    if cfg.replicas is not None and len(groups) < cfg.replicas:
        notes.refuse(f"replicas: {cfg.replicas} of {k} GPUs each needs {cfg.replicas * (k or 1)} GPUs; "
                     f"{len(gpus)} are selected")
    for g in groups:
        _explain(model, inv, g, cfg, notes, latency)
    used = {gpu.index for g in groups for gpu in g.gpus}
    for gpu in gpus:
        if gpu.index not in used and groups:
            notes.warnings.append(f"GPU {gpu.index} stays unused (no complete group of {len(groups[0].gpus)} "
                                  "GPUs left for another replica)")
    return groups


def _partition(inv: Inventory, gpus: tuple[Gpu, ...], k: int) -> list[tuple[Gpu, ...]]:
    """Groups of ``k`` GPUs, in index order, each preferring GPUs NVLinked to all its members."""
    left = sorted(gpus, key=lambda g: g.index)
    out = []
    while len(left) >= k:
        group = [left.pop(0)]
        while len(group) < k:
            linked = [g for g in left if inv.all_linked(tuple(x.index for x in group) + (g.index,), "nvlink")]
            pick = (linked or left)[0]
            group.append(pick)
            left.remove(pick)
        out.append(tuple(group))
    return out


def _fit_group(model: ModelInfo, inv: Inventory, members: tuple[Gpu, ...], cfg: FleetConfig,
               ctx: ContextShape) -> Candidate:
    if len(members) == 1:
        (need,), _ = replica_needs(model, ctx, "none", (1.0,), cfg.n_gpu_layers)
        return Candidate(members, "none", (), (need,))
    mode: SplitModeName
    if model.engine == "torch":
        mode = "layer"  # the torch engine's device map places whole layers
    elif cfg.split_mode in ("layer", "tensor"):
        mode = "tensor" if cfg.split_mode == "tensor" else "layer"
    else:
        nvlink = inv.all_linked(tuple(g.index for g in members), "nvlink")
        mode = "tensor" if nvlink and cfg.flash_attn is not False else "layer"
    if cfg.split_ratio is not None:
        ratios = normalize(cfg.split_ratio)
        return Candidate(members, mode, ratios, replica_needs(model, ctx, mode, ratios, cfg.n_gpu_layers)[0])
    return balance(model, members, mode, cfg, ctx)


def _explain(model: ModelInfo, inv: Inventory, g: Candidate, cfg: FleetConfig, notes: Notes, latency: bool) -> None:
    ids = ", ".join(str(x.index) for x in g.gpus)
    if g.mode == "none":
        notes.reasons.append(f"one replica on GPU {ids} (one GPU per replica)")
        return
    nvlink = inv.all_linked(tuple(x.index for x in g.gpus), "nvlink")
    why = ("prefer: latency on NVLinked GPUs" if latency else
           f"split_mode: {cfg.split_mode}" if cfg.split_mode != "auto" else
           f"split_ratio {cfg.split_ratio}" if cfg.split_ratio is not None else
           "the model does not fit one GPU")
    link = "NVLink between every pair" if nvlink else "PCIe between some GPUs"
    notes.reasons.append(f"{g.mode} split over GPUs {ids} ({why}; {link}), tensor_split {list(g.ratios)}")
    if g.mode == "tensor" and not nvlink:
        notes.warnings.append(f"tensor split over PCIe (GPUs {ids}) exchanges activations every layer and is "
                              "usually slower than layer split; prefer split_mode: layer or auto")
    if g.mode == "tensor" and cfg.flash_attn is False:
        notes.warnings.append("tensor split needs flash attention; llama.cpp will refuse flash_attn: false")
    if g.mode == "tensor" and model.architecture != "llama":
        notes.warnings.append(f"tensor split is only verified for llama; {model.architecture} may be refused")
    if cfg.split_ratio is not None:
        warning = ratio_warning(g.gpus, g.needs, g.ratios, cfg.vram_margin_mib)
        if warning:
            notes.warnings.append(warning)


def _layout(groups: list[Candidate], gpus: tuple[Gpu, ...], cfg: FleetConfig) -> tuple[tuple[ReplicaPlan, ...],
                                                                                      tuple[Budget, ...]]:
    replicas = []
    where: dict[int, tuple[int | None, DeviceNeed]] = {}
    for r, g in enumerate(groups):
        ids = tuple(x.index for x in g.gpus)
        main = cfg.main_gpu if cfg.main_gpu in ids else ids[0]
        replicas.append(ReplicaPlan(gpus=ids, split_mode=g.mode, tensor_split=g.ratios if len(ids) > 1 else (),
                                    main_gpu=main))
        for gpu, need in zip(g.gpus, g.needs, strict=True):
            where.setdefault(gpu.index, (r, need))
    budgets = []
    for gpu in gpus:
        owner, need = where.get(gpu.index, (None, DeviceNeed(0, 0, 0)))
        budgets.append(Budget(device=f"GPU {gpu.index}", name=gpu.name, replica=owner, weights_mib=mib(need.weights),
                              kv_mib=mib(need.kv), compute_mib=mib(need.compute),
                              margin_mib=cfg.vram_margin_mib if owner is not None else 0, capacity_mib=gpu.free_mib))
    return tuple(replicas), tuple(budgets)
