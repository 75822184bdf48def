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

This module checks the configuration's rules and picks where the plan is made: on the GPUs
(:mod:`llamafleet.placement.gpu_plan`) or the CPU (:mod:`llamafleet.placement.cpu_plan`, which also sizes every
plan's RAM tier of the KV cache).

:func:`launch_spec` turns one replica of a plan into a worker's environment and :class:`EngineConfig`, the
configuration's part of it mapped by :func:`engine_config`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llamafleet.config import FleetConfig
from llamafleet.engine.cores import default_threads
from llamafleet.engine.speculative.settings import SpeculativeConfig
from llamafleet.engine.types import EngineConfig, PriorityConfig
from llamafleet.model.checkpoint import is_checkpoint
from llamafleet.model.header import GgufError, ModelInfo, read_model_info
from llamafleet.placement import rpc_plan
from llamafleet.placement.advice import mib
from llamafleet.placement.autofit import fit_unset
from llamafleet.placement.cpu_plan import cpu_plan
from llamafleet.placement.draft import Notes, to_plan, with_adapters
from llamafleet.placement.gpu_plan import gpu_plan
from llamafleet.placement.gpus import Gpu, Inventory
from llamafleet.placement.memory import MIB, ContextShape, pad_ctx, with_draft
from llamafleet.placement.plan import Budget, Plan, ReplicaPlan
from llamafleet.placement.torch_plan import engine_refusal, torch_engine_note

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
        n_park=cfg.cache_park if cfg.prefix_cache else 0,
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
        f"each replica: {ctx.n_seq} slots x {ctx.n_ctx_per_seq} tokens"
        f"{f' (and {ctx.n_park} parked sessions)' if ctx.n_park else ''}, KV cache "
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
    if cfg.lora:
        model = with_adapters(model, cfg, notes)
        if notes.refused:
            return to_plan(model=model, ctx=ctx, cfg=cfg, notes=notes, device="gpu" if inventory.gpus else "cpu"), True
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
        return cpu_plan(model, inventory, cfg, ctx, notes, why)
    return gpu_plan(model, inventory, gpus, cfg, ctx, notes)


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
        n_park=cfg.cache_park,
        cache_dir=cfg.cache_dir,
        cache_disk_bytes=cfg.cache_disk_mib * MIB,
        cuda_graphs=cfg.cuda_graphs == "auto",
        llama_log_level=cfg.llama_log_level,
        lora=tuple(e.spec() for e in cfg.lora),
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
