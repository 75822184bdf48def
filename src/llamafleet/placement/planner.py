"""Decide where a model runs: replica groups, split mode, ``tensor_split``, context sizes, and the memory budget.

:func:`make_plan` is a pure function of the model's header (:mod:`llamafleet.model.header`), the machine's GPUs
(:mod:`llamafleet.placement.gpus`) and the configuration; it loads nothing and refuses a plan that cannot fit *before*
anything loads, with the numbers and what would make it fit. Policy (measured facts in docs/PLANNER.md):

* A model that fits one GPU with its KV cache and buffers runs as **one replica per GPU** (data parallel: two
  replicas on two GPUs serve about twice one).
* One that does not is **split over the fewest GPUs that hold it**, replicated over the rest: tensor split where
  every pair in the group is NVLinked, layer split otherwise; ratios proportional to what each GPU can hold.
* ``prefer: latency`` on NVLinked GPUs puts one replica tensor-split over all of them (lowest single-stream delay).
* Explicit choices (``split_mode``, ``split_ratio``, ``replicas``, ``main_gpu``, ``gpus``) are honoured but checked:
  a GPU that overflows is named with the amount; a lopsided ``split_ratio`` is flagged.
* Without GPUs the plan is a CPU plan: ``replicas`` (default 1) processes sharing the mapped weights, checked
  against available RAM.
* ``parallel`` and ``context_length`` left unset are fitted: the largest shape that fits, down to floors
  (:mod:`llamafleet.placement.autofit`).
* Other hosts' devices (``rpc_servers``) join only a model that does not fit this host, as one layer-split replica
  (:mod:`llamafleet.placement.rpc_plan`).

:func:`launch_spec` turns one replica of a plan into a worker's environment and :class:`EngineConfig`, the
configuration's part of it mapped by :func:`engine_config`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llamafleet.config import FleetConfig
from llamafleet.engine.cores import default_threads
from llamafleet.engine.speculative.settings import SpeculativeConfig
from llamafleet.engine.types import EngineConfig, PriorityConfig, SplitModeName
from llamafleet.model.checkpoint import is_checkpoint
from llamafleet.model.header import GgufError, ModelInfo, read_model_info
from llamafleet.placement import rpc_plan
from llamafleet.placement.advice import how_to_fit, mib, ratio_warning
from llamafleet.placement.autofit import fit_unset
from llamafleet.placement.draft import Candidate, Notes, balance, normalize, to_plan
from llamafleet.placement.gpus import Gpu, Inventory
from llamafleet.placement.memory import MIB, ContextShape, DeviceNeed, pad_ctx, replica_needs, with_draft
from llamafleet.placement.plan import Budget, Plan, ReplicaPlan
from llamafleet.placement.torch_plan import engine_refusal, torch_engine_note

KV_TIER_MAX_MIB = 8192  # the RAM tier's default bound per replica (llama-server's --cache-ram default)
KV_TIER_UNKNOWN_MIB = 1024  # ... when the host's memory is unknown

__all__ = ["Budget", "Plan", "ReplicaPlan", "context_shape", "engine_config", "launch_spec", "make_plan"]


def context_shape(model: ModelInfo, cfg: FleetConfig) -> ContextShape:
    """The context llama.cpp will create for ``cfg`` (sequence length rounded up to 256, batches capped)."""
    n_ctx_per_seq = pad_ctx(cfg.context_length)
    n_batch = min(cfg.batch_size, n_ctx_per_seq * cfg.parallel)
    return ContextShape(
        n_ctx_per_seq=n_ctx_per_seq,
        n_seq=cfg.parallel,
        n_batch=n_batch,
        n_ubatch=min(cfg.n_ubatch, n_batch),
        kv_type=cfg.kv_cache_type,
        flash_attn=cfg.flash_attn is not False,  # "auto" turns it on for the CPU and CUDA backends
    )


def make_plan(model: ModelInfo, inventory: Inventory, cfg: FleetConfig) -> Plan:
    """Plan ``model`` on ``inventory`` under ``cfg``. Pure: reads nothing (but a draft model's header), loads nothing.

    ``parallel`` and ``context_length`` that the configuration does not set are fitted
    (:func:`~llamafleet.placement.autofit.fit_unset`).
    """
    return fit_unset(model, inventory, cfg, _place)


def _place(model: ModelInfo, inventory: Inventory, cfg: FleetConfig) -> tuple[Plan, bool]:
    """The plan for exactly ``cfg``'s shape, and whether a rule (not memory) refused it."""
    ctx = context_shape(model, cfg)
    notes = Notes()
    if ctx.n_ctx_per_seq != cfg.context_length:
        notes.warnings.append(f"context_length {cfg.context_length} rounded up to {ctx.n_ctx_per_seq} (llama.cpp "
                              "sizes each sequence in steps of 256)")
    if model.n_ctx_train and ctx.n_ctx_per_seq > model.n_ctx_train:
        notes.warnings.append(f"context_length {ctx.n_ctx_per_seq} exceeds the {model.n_ctx_train} tokens the model "
                              "was trained on; answers past that length degrade")
    notes.reasons.append(
        f"{cfg.served_name(model.path)} ({model.file_type}, {mib(model.weights_bytes)} MiB of weights, "
        f"{model.n_layer} layers); "
        f"each replica: {ctx.n_seq} slots x {ctx.n_ctx_per_seq} tokens, KV cache "
        + (ctx.kv_type if model.engine != "torch" else torch_engine_note(model, bool(inventory.gpus)
                                                                          and cfg.n_gpu_layers != 0))
    )
    if why := engine_refusal(model, cfg):
        notes.refuse(why)
        return to_plan(model=model, ctx=ctx, cfg=cfg, notes=notes, device="gpu" if inventory.gpus else "cpu"), True
    if (path := cfg.speculative.draft_model) is not None and cfg.speculative.mode == "draft":
        try:
            draft = read_model_info(path)
        except (GgufError, OSError) as e:
            notes.refuse(f"speculative.draft_model {path}: {e}; name a GGUF model with the served model's vocabulary")
            return to_plan(model=model, ctx=ctx, cfg=cfg, notes=notes, device="gpu" if inventory.gpus else "cpu"), True
        notes.reasons.append(f"draft model {draft.name or path} ({mib(draft.weights_bytes)} MiB of weights, "
                             f"{draft.n_layer} layers) beside it in each replica: its weights and KV are counted")
        model = with_draft(model, draft)
    if ctx.kv_type != "f16" and cfg.flash_attn is False:
        notes.refuse(f"kv_cache_type {ctx.kv_type} needs flash attention, but flash_attn is false: "
                     "set flash_attn: true (or leave it unset), or use kv_cache_type: f16")
        return to_plan(model=model, ctx=ctx, cfg=cfg, notes=notes, device="gpu" if inventory.gpus else "cpu"), True
    if cfg.gpus is not None:
        missing = [i for i in cfg.gpus if i not in {g.index for g in inventory.gpus}]
        if missing:
            have = ", ".join(str(g.index) for g in inventory.gpus) or "none"
            notes.refuse(f"gpus lists {missing}, which this machine does not have (GPUs: {have}); "
                         "fix the 'gpus' key or remove it to use every GPU")
            return to_plan(model=model, ctx=ctx, cfg=cfg, notes=notes, device="gpu"), True
    gpus = tuple(g for g in inventory.gpus if cfg.gpus is None or g.index in cfg.gpus)
    if inventory.rpc:
        return rpc_plan.place(model, inventory, gpus, cfg, ctx, notes, _local)
    return _local(model, inventory, gpus, cfg, ctx, notes), notes.refused


def _local(model: ModelInfo, inventory: Inventory, gpus: tuple[Gpu, ...], cfg: FleetConfig, ctx: ContextShape,
           notes: Notes) -> Plan:
    """The plan on this host's own devices: its selected GPUs, or the CPU."""
    if not gpus or cfg.n_gpu_layers == 0:
        why = inventory.note or ("gpus: [] selects none" if inventory.gpus else "no GPU found")
        if cfg.n_gpu_layers == 0:
            why = "n_gpu_layers: 0"
        return _cpu_plan(model, inventory, cfg, ctx, notes, why)
    return _gpu_plan(model, inventory, gpus, cfg, ctx, notes)


def _cpu_plan(model: ModelInfo, inv: Inventory, cfg: FleetConfig, ctx: ContextShape, notes: Notes,
              why: str) -> Plan:
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


def _gpu_plan(model: ModelInfo, inv: Inventory, gpus: tuple[Gpu, ...], cfg: FleetConfig, ctx: ContextShape,
              notes: Notes) -> Plan:
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


def engine_config(cfg: FleetConfig, model_path: str, **decided: Any) -> EngineConfig:
    """The engine settings ``cfg`` gives a worker of ``model_path``: the one mapping of configuration keys onto
    :class:`EngineConfig`, for ``serve`` (through :func:`launch_spec`), ``bench engine`` and ``consistency``.
    ``decided`` holds what a plan (or the caller) decides instead of the keys: slots, context, batch, devices."""
    return replace(EngineConfig(
        model_path=model_path,
        engine="torch" if is_checkpoint(model_path) else "llama.cpp",
        n_seq=cfg.parallel,
        n_ctx_per_seq=cfg.context_length,
        n_batch=cfg.batch_size,
        n_ubatch=cfg.n_ubatch,
        prefill_tokens=cfg.prefill_tokens,
        n_threads=cfg.threads,
        n_gpu_layers=cfg.n_gpu_layers,
        kv_cache_type=cfg.kv_cache_type,
        flash_attn=cfg.flash_attn,
        backend_sampling=cfg.backend_sampling,
        prefix_cache=cfg.prefix_cache,
        speculative=SpeculativeConfig(**cfg.speculative.model_dump()),
        priorities=PriorityConfig(**cfg.priorities.model_dump()),
        cache_ram_bytes=(cfg.cache_ram_mib or 0) * MIB,
        cache_dir=cfg.cache_dir,
        cache_disk_bytes=cfg.cache_disk_mib * MIB,
        llama_log_level=cfg.llama_log_level,
    ), **decided)


def launch_spec(plan: Plan, replica: int, cfg: FleetConfig, model_path: str) -> tuple[dict[str, str], EngineConfig]:
    """The environment and engine configuration for the worker of ``plan.replicas[replica]``.

    The worker sees only its GPUs (``CUDA_VISIBLE_DEVICES`` in PCI bus order, so NVML's indices apply), renumbered
    from 0; on a CPU plan it sees none, offloads nothing, and the CPU's threads are shared between the replicas.
    Its steps overlap text work with the next decode only where that decode runs on a device: on the CPU
    ``llama_decode`` returns when the pass is done, so overlapping would only ship every token a pass later.
    """
    if not plan.fits:
        raise ValueError("this plan does not fit; refusing to launch it (see plan.reasons)")
    if not 0 <= replica < len(plan.replicas):
        raise IndexError(f"replica {replica} is not in the plan (it has {len(plan.replicas)})")
    r = plan.replicas[replica]
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in r.gpus)}
    threads = cfg.threads
    if plan.device == "cpu" and threads is None:
        threads = default_threads(len(plan.replicas))
    return env, engine_config(
        cfg, model_path, n_seq=plan.n_seq, n_ctx_per_seq=plan.n_ctx_per_seq, n_batch=plan.n_batch,
        n_ubatch=plan.n_ubatch, n_threads=threads,
        n_gpu_layers=r.n_gpu_layers if r.n_gpu_layers is not None else cfg.n_gpu_layers if r.gpus else 0,
        split_mode=r.split_mode, main_gpu=r.gpus.index(r.main_gpu) if r.gpus else 0, tensor_split=r.tensor_split,
        rpc_servers=r.rpc_servers, cache_ram_bytes=(plan.kv_tier_mib or cfg.cache_ram_mib or 0) * MIB,
        overlap=bool(r.gpus or r.rpc_servers))
