"""Plans that use other hosts' devices (``rpc_servers``): one replica, its layers split over local and remote devices.

Called by :func:`llamafleet.placement.planner.make_plan` when the inventory has remote devices
(:mod:`llamafleet.placement.rpc_probe` asked the servers). Policy:

* With ``split_mode: auto`` the remote devices are used only when the model does not fit this host: every token
  then crosses the network, so a model that fits locally runs faster locally. ``split_mode: layer`` splits over them
  anyway (a test or a measurement); ``none`` and ``tensor`` cannot use them and are refused.
* One replica: a llama.cpp RPC server serves one client at a time, so its devices belong to one replica.
* The remote devices come first in llama.cpp's device order (as llama.cpp orders them itself), local GPUs last, so
  the output head and the logits stay on this host: this host's GPUs, or its CPU (llama.cpp's CPU device) when it
  has none. The ratios follow each device's free memory (available RAM for the CPU), as for any layer split.
* The notes carry the link's arithmetic: activations of ``n_embd x 4`` bytes per token cross each host boundary,
  and every decode step waits at least one network round trip per remote server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from llamafleet.config import FleetConfig
from llamafleet.engine.devices import HOST, layer_devices
from llamafleet.model.header import ModelInfo
from llamafleet.placement.advice import mib
from llamafleet.placement.draft import Notes, balance, to_plan
from llamafleet.placement.gpus import Gpu, Inventory
from llamafleet.placement.memory import ContextShape, DeviceNeed, replica_needs
from llamafleet.placement.plan import Budget, Device, Plan, ReplicaPlan

REMOTE_INDEX = 1_000_000  # pseudo GPU indices of remote devices inside this module (never shown)

LocalPlanner = Callable[[ModelInfo, Inventory, tuple[Gpu, ...], FleetConfig, ContextShape, Notes], Plan]


def place(model: ModelInfo, inv: Inventory, gpus: tuple[Gpu, ...], cfg: FleetConfig, ctx: ContextShape,
          notes: Notes, local: LocalPlanner) -> tuple[Plan, bool]:
    """The plan with ``inv.rpc`` in play, and whether a rule (not memory) refused it."""
    if cfg.split_mode in ("none", "tensor"):
        notes.refuse(f"rpc_servers split the model by layers, but split_mode is {cfg.split_mode}: set split_mode "
                     "to auto (remote devices only when the model does not fit here) or layer (always)")
    if cfg.replicas not in (None, 1):
        notes.refuse(f"replicas: {cfg.replicas} with rpc_servers: an RPC server serves one client at a time, so the "
                     "split model is one replica; remove replicas (or set 1)")
    if cfg.split_ratio is not None:
        notes.refuse("split_ratio cannot be combined with rpc_servers yet: remove it (the planner splits by the "
                     "free memory of each device)")
    if notes.refused:
        return to_plan(model=model, ctx=ctx, cfg=cfg, notes=notes, device="gpu" if gpus else "cpu"), True
    if cfg.split_mode == "auto":
        alone = Notes(list(notes.reasons), list(notes.warnings))
        plan = local(model, inv, gpus, cfg, ctx, alone)
        if plan.fits:
            why = (f"rpc_servers are not used: the model fits this host, where it decodes faster than over the "
                   f"network (set split_mode: layer to split over them anyway; {_link_cost(model, ctx, inv, cfg)})")
            return replace(plan, warnings=(*plan.warnings, why)), False
    remote = tuple(Gpu(REMOTE_INDEX + i, d.label, d.total_mib, d.free_mib) for i, d in enumerate(inv.rpc))
    if gpus and cfg.n_gpu_layers != 0:
        return _with_gpus(model, inv, remote, gpus, cfg, ctx, notes), False
    return _with_cpu(model, inv, remote, cfg, ctx, notes), False


def _with_gpus(model: ModelInfo, inv: Inventory, remote: tuple[Gpu, ...], gpus: tuple[Gpu, ...], cfg: FleetConfig,
               ctx: ContextShape, notes: Notes) -> Plan:
    cand = balance(model, remote + gpus, "layer", cfg, ctx)
    host = replica_needs(model, ctx, "layer", cand.ratios, cfg.n_gpu_layers)[1]
    replica = ReplicaPlan(gpus=tuple(g.index for g in gpus), split_mode="layer", tensor_split=cand.ratios,
                          main_gpu=gpus[0].index, rpc_servers=_endpoints(inv), n_gpu_layers=cfg.n_gpu_layers)
    return _finish(model, inv, cand.needs, replica, cfg, ctx, notes, "gpu", host.total, [
        Budget(device=f"GPU {g.index}", name=g.name, replica=0, weights_mib=mib(n.weights), kv_mib=mib(n.kv),
               compute_mib=mib(n.compute), margin_mib=cfg.vram_margin_mib, capacity_mib=g.free_mib)
        for g, n in zip(gpus, cand.needs[len(remote):], strict=True)])


def _with_cpu(model: ModelInfo, inv: Inventory, remote: tuple[Gpu, ...], cfg: FleetConfig, ctx: ContextShape,
              notes: Notes) -> Plan:
    """This host's CPU is the split's last device (llama.cpp's CPU device): the last layers and the output head."""
    known = inv.host_mem_mib is not None
    here = inv.host_mem_mib if inv.host_mem_mib is not None else sum(g.free_mib for g in remote) // len(remote)
    cand = balance(model, (*remote, Gpu(REMOTE_INDEX - 1, "CPU", here, here)), "layer", cfg, ctx)
    need, host = cand.needs[-1], replica_needs(model, ctx, "layer", cand.ratios)[1]
    cpu = Budget(device="CPU", name="host memory", replica=0, weights_mib=mib(need.weights + host.weights),
                 kv_mib=mib(need.kv + host.kv), compute_mib=mib(need.compute + host.compute),
                 margin_mib=cfg.vram_margin_mib, capacity_mib=inv.host_mem_mib)
    if not known:
        notes.warnings.append("available RAM is unknown: this host's share was sized as one more remote device "
                              "and not checked")
    replica = ReplicaPlan(gpus=(), split_mode="layer", tensor_split=cand.ratios, main_gpu=-1,
                          rpc_servers=_endpoints(inv), n_gpu_layers=-1)
    return _finish(model, inv, cand.needs, replica, cfg, ctx, notes, "cpu", 0, [cpu])


def _finish(model: ModelInfo, inv: Inventory, needs: tuple[DeviceNeed, ...], replica: ReplicaPlan, cfg: FleetConfig,
            ctx: ContextShape, notes: Notes, device: Device, host: int, local: list[Budget]) -> Plan:
    """Budgets for every device (``needs`` starts with the remote ones), the verdict and the reasons."""
    n = len(inv.rpc)
    remote_budgets = [Budget(device=d.label, name="rpc-server", replica=0, weights_mib=mib(need.weights),
                             kv_mib=mib(need.kv), compute_mib=mib(need.compute), margin_mib=cfg.vram_margin_mib,
                             capacity_mib=d.free_mib) for d, need in zip(inv.rpc, needs, strict=False)]
    budgets = (*local, *remote_budgets)
    fits = all(b.overflow_mib == 0 for b in budgets)
    for b in budgets:
        if b.overflow_mib:
            notes.reasons.append(f"{b.device} overflows by {b.overflow_mib} MiB (needs {b.used_mib} MiB with the "
                                 f"margin, has {b.capacity_mib} MiB free)")
    notes.reasons.append(f"layer split over {replica.label} ({n} remote device(s), rpc_servers; "
                         f"{'split_mode: layer' if cfg.split_mode == 'layer' else 'the model does not fit this host'})"
                         f", tensor_split {list(replica.tensor_split)} (remote devices first)")
    notes.reasons.append(_link_cost(model, ctx, inv, cfg, replica))
    return to_plan(model=model, ctx=ctx, cfg=cfg, notes=notes, device=device, fits=fits, replicas=(replica,),
                   budgets=budgets, host=host)


def _endpoints(inv: Inventory) -> tuple[str, ...]:
    return tuple(dict.fromkeys(d.endpoint for d in inv.rpc))


def _link_cost(model: ModelInfo, ctx: ContextShape, inv: Inventory, cfg: FleetConfig,
               replica: ReplicaPlan | None = None) -> str:
    """The network's share of each token and of the load, in numbers (see docs/DEPLOYMENT.md for the arithmetic)."""
    per_token = model.n_embd * 4  # f32 activations between layers
    servers = _endpoints(inv)
    rtt = max((d.rtt_ms or 0.0) for d in inv.rpc)
    bytes_per_s = cfg.rpc_link_gbps * 1e9 / 8
    if replica is None:
        return (f"over the network each token would cost at least {len(servers)} round trip(s) of about "
                f"{rtt:.2f} ms and {per_token} bytes per crossing")
    layers = -1 if replica.n_gpu_layers is None else replica.n_gpu_layers
    where = layer_devices(model.n_layer, replica.tensor_split, layers)
    remote = len(inv.rpc)
    side = ["here"] + ["here" if d == HOST or d >= remote else f"remote {d}" for d in where] + ["here"]
    hops = sum(1 for a, b in zip(side, side[1:], strict=False) if a != b)
    weights = sum(d.weights for d in replica_needs(model, ctx, "layer", replica.tensor_split, layers)[0][:remote])
    delay_ms = len(servers) * rtt + 1000 * hops * per_token / bytes_per_s
    return (f"the link: each decode step sends {model.n_embd} x 4 = {per_token} bytes per token across each of "
            f"{hops} host boundaries ({hops * per_token * ctx.n_seq} bytes per step with all {ctx.n_seq} slots busy) "
            f"and waits at least {len(servers)} network round trip(s) ({rtt:.2f} ms measured): single-stream decode "
            f"gets about {delay_ms:.2f} ms slower per token than on local devices; at load, {mib(weights)} MiB of "
            f"weights cross the link (about {weights / bytes_per_s:.1f} s at rpc_link_gbps {cfg.rpc_link_gbps:g})")
