"""Plain-words advice for the planner: what would make a refused plan fit, whether a given split is lopsided, and
which valid keys cannot apply on this machine."""

from __future__ import annotations

import math
from collections.abc import Sequence

from llamafleet.config import FleetConfig
from llamafleet.model.header import ModelInfo
from llamafleet.placement.gpus import Gpu, Inventory
from llamafleet.placement.memory import (
    CTX_PAD,
    MIB,
    ContextShape,
    DeviceNeed,
    compute_bytes,
    kv_bytes_per_token,
    replica_needs,
)
from llamafleet.placement.plan import Budget

Q4_0_BITS = 4.5  # bits per weight of a Q4_0 file
LOPSIDED = 0.15  # flag a split whose GPUs' fill levels differ by more than this


def mib(n_bytes: float) -> int:
    """Bytes to MiB, rounded up."""
    return math.ceil(n_bytes / MIB)


def how_to_fit(model: ModelInfo, ctx: ContextShape, cfg: FleetConfig, usable: Sequence[int], replicas: int,
               *, host: bool) -> list[str]:
    """Suggestions, with numbers, for a plan over devices with ``usable`` bytes each (after the margin).

    The best case is assumed: one replica spread over every device (``host``: the CPU, where ``replicas`` share the
    weights and each needs its own KV cache and buffers).
    """
    if host:
        (_, need) = replica_needs(model, ctx, "none", ())
        avail = sum(usable) - replicas * need.compute
        weights, kv_per_replica, share = need.weights, need.kv, replicas
    else:
        (one,), _ = replica_needs(model, ctx, "none", (1.0,), cfg.n_gpu_layers)
        avail = sum(usable) - len(usable) * compute_bytes(model, ctx, layers=True, output=True)
        weights, kv_per_replica, share = one.weights, one.kv, 1
    out = []
    where = "RAM" if host else f"the {len(usable)} selected GPU(s)"
    if weights > avail:
        out.append(f"the weights alone need {mib(weights)} MiB but {where} {'offers' if host else 'offer'} "
                   f"{max(0, mib(avail))} MiB after "
                   "the margin and compute buffers")
        q4 = model.n_params * Q4_0_BITS / 8
        if q4 < model.weights_bytes * 0.9:
            out.append(f"a Q4_0 file of this model would need about {mib(q4)} MiB of weights")
        if not host and usable:
            per_gpu = max(usable) - compute_bytes(model, ctx, layers=True, output=True)
            if per_gpu > 0:
                n = math.ceil((weights + kv_per_replica) / per_gpu)
                out.append(f"or about {n} GPUs with {mib(max(usable)) + cfg.vram_margin_mib} MiB free each")
        return out
    per_token = kv_bytes_per_token(model, ctx.kv_type) * share
    tokens = int((avail - weights) / per_token) if per_token else 0
    copies = f"{share} replicas x " if share > 1 else ""
    out.append(f"the KV cache needs {mib(kv_per_replica * share)} MiB for {copies}{ctx.n_seq} slots x "
               f"{ctx.n_ctx_per_seq} tokens, but only {mib(avail - weights)} MiB remain after the weights")
    ctx_fit = tokens // ctx.n_seq // CTX_PAD * CTX_PAD
    if CTX_PAD <= ctx_fit < ctx.n_ctx_per_seq:
        out.append(f"lower context_length to {ctx_fit} (with parallel {ctx.n_seq})")
    if 1 <= tokens // ctx.n_ctx_per_seq < ctx.n_seq:
        out.append(f"or lower parallel to {tokens // ctx.n_ctx_per_seq} (with context_length {ctx.n_ctx_per_seq})")
    if share > 1:
        out.append("or run fewer replicas: each has its own KV cache")
    if ctx.kv_type == "f16":
        out.append("or set kv_cache_type: q8_0 (about half the KV cache)")
    out.append("or add memory: more GPUs, or a smaller quantization of the model")
    if not host and cfg.split_ratio is not None:
        out.append("(these figures assume split ratios proportional to each GPU's free memory, not split_ratio)")
    return out


def ratio_warning(gpus: Sequence[Gpu], needs: Sequence[DeviceNeed], ratios: Sequence[float],
                  margin_mib: int) -> str | None:
    """A warning when an explicit split leaves its GPUs very unevenly full, with the ratios that balance them."""
    fill = [(mib(n.total) + margin_mib) / max(g.free_mib, 1) for g, n in zip(gpus, needs, strict=True)]
    if max(fill) - min(fill) <= LOPSIDED:
        return None
    room = [max(g.free_mib - margin_mib - mib(n.compute), 1) for g, n in zip(gpus, needs, strict=True)]
    balanced = [round(r / sum(room), 2) for r in room]
    levels = ", ".join(f"GPU {g.index} to {f:.0%}" for g, f in zip(gpus, fill, strict=True))
    return (f"split_ratio {list(ratios)} is lopsided for these GPUs ({', '.join(f'{g.free_mib} MiB' for g in gpus)}"
            f" free): it fills {levels}; split_ratio {balanced} (proportional to what each can hold) balances them")


def inapplicable(cfg: FleetConfig, inventory: Inventory, cores: int | None) -> list[str]:
    """Keys that are valid but cannot apply here, each with what to do: GPU placement keys on a machine with no GPU
    in ``inventory``, ``threads`` above ``cores`` (``None``: not known, not checked). The planner takes such keys
    without effect; the commands print these lines so that nobody believes a setting is in force when it is not."""
    out = []
    if not inventory.gpus:
        why = inventory.note or "no GPU found"
        gpu_keys = [k for k in ("main_gpu", "split_ratio") if getattr(cfg, k) is not None]
        if cfg.split_mode == "tensor" or (cfg.split_mode == "layer" and not cfg.rpc_servers):
            gpu_keys.append("split_mode")
        out += [f"{k} is set but this machine has no GPU ({why}): it does nothing on the CPU; remove it, or run "
                "`llamafleet check-env` if a GPU should be there" for k in gpu_keys]
    if cfg.threads is not None and cores is not None and cfg.threads > cores:
        out.append(f"threads {cfg.threads} is more than this machine's {cores} CPU cores: the extra threads only "
                   f"contend for the same cores; set threads to {cores} or fewer, or leave it unset")
    return out


def park_room(model: ModelInfo, ctx: ContextShape, budgets: Sequence[Budget]) -> str | None:
    """How many more parked sessions (``cache_park``) the GPU memory a fitting plan leaves would hold per replica,
    in words; None when none would (or the memory is unknown). A parked sequence costs a slot's KV, and a park tier
    one spare sequence more."""
    per = kv_bytes_per_token(model, ctx.kv_type) * ctx.n_ctx_per_seq
    rooms: dict[int, int] = {}
    for b in budgets:
        if b.replica is not None and b.capacity_mib is not None:
            rooms[b.replica] = rooms.get(b.replica, 0) + max(0, b.capacity_mib - b.used_mib)
    n = min(rooms.values(), default=0) * MIB // int(per) if per else 0
    n -= 0 if ctx.n_park else 1  # the first parked session brings the spare sequence with it (engine/kv_park.py)
    if n < 1:
        return None
    return (f"the GPU memory left would hold {n} more parked session(s) per replica (cache_park, "
            f"{mib(per)} MiB each: a slot's KV, restored without a host copy)")
