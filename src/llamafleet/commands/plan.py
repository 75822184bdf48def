"""``llamafleet plan``: show how a model would be placed on this machine's GPUs (or a described one); exit 0 if it
fits, 1 if not, 2 on a bad flag or config value, 3 on a model file it cannot read (:class:`llamafleet.exits.Exit`).
With several models (``models:`` or ``--models-dir``), the whole fleet: each model's shape, the resident set with the
memory per device, and what loading each swapped model would evict."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from llamafleet.config import ConfigError, FleetConfig, load_config
from llamafleet.exits import Exit
from llamafleet.flags import add_config_flag, add_flags, overrides

if TYPE_CHECKING:
    from llamafleet.catalog import ServedModel
    from llamafleet.model.header import ModelInfo
    from llamafleet.placement.gpus import Inventory
    from llamafleet.placement.packing import Demand, Packing
    from llamafleet.placement.planner import Plan


def table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def format_plan(plan: Plan, model: ModelInfo, inventory: Inventory, cuda_graphs: bool) -> str:
    """The plan as a few readable sections: verdict, replicas, context, memory per device, reasons, warnings
    (``cuda_graphs``: the key's setting, for a checkpoint folder's decode steps)."""
    from llamafleet.placement.gpus import describe_inventory
    from llamafleet.placement.torch_plan import torch_context

    lines = [
        f"model: {model.path}",
        f"  {plan.model}: {model.architecture}, {model.file_type}, {model.n_layer} layers, {model.n_embd} embd, "
        f"{model.n_head}/{model.n_head_kv} heads/KV heads, trained context {model.n_ctx_train}",
        # with no GPU, the reasons say why ("CPU plan (NVML not available ...)"): said once
        *([describe_inventory(inventory)] if inventory.gpus or inventory.rpc else []),
        "",
        f"plan: {'FITS' if plan.fits else 'DOES NOT FIT'} ({len(plan.replicas)} replica(s) on the {plan.device})",
    ]
    if plan.replicas:
        rows = [["replica", "gpus", "split", "tensor_split", "main_gpu"]]
        for i, r in enumerate(plan.replicas):
            rows.append([str(i), (",".join(map(str, r.gpus)) or "cpu") + "".join(f" + rpc {e}" for e in r.rpc_servers),
                         r.split_mode,
                         ",".join(f"{x:.4g}" for x in r.tensor_split) or "-", str(r.main_gpu) if r.gpus else "-"])
        lines += table(rows)
    fa = {None: "auto", True: "on", False: "off"}[plan.flash_attn]
    engine = (torch_context(plan, cuda_graphs) if model.engine == "torch" else
              f"n_batch {plan.n_batch}, n_ubatch {plan.n_ubatch}; KV cache {plan.kv_type}; flash attention {fa}")
    lines.append(f"context: {plan.n_seq} slots x {plan.n_ctx_per_seq} tokens per replica; {engine}")
    if plan.budgets:
        lines.append("memory (MiB):")
        rows = [["device", "replica", "weights", "kv", "compute", "margin", "total", "free", "left"]]
        for b in plan.budgets:
            left = "?" if b.capacity_mib is None else str(b.capacity_mib - b.used_mib)
            rows.append([b.device, "-" if b.replica is None else str(b.replica), str(b.weights_mib), str(b.kv_mib),
                         str(b.compute_mib), str(b.margin_mib), str(b.used_mib),
                         "?" if b.capacity_mib is None else str(b.capacity_mib), left])
        lines += table(rows)
    if plan.host_mib:
        lines.append(f"host memory per replica: {plan.host_mib} MiB (token embedding, logits)")
    lines.append("why:")
    lines += [f"  - {r}" for r in plan.reasons]
    if plan.warnings:
        lines.append("warnings:")
        lines += [f"  - {w}" for w in plan.warnings]
    return "\n".join(lines)


def fleet_json(packing: Packing, demands: list[Demand], served: list[ServedModel], inventory: Inventory,
               margin_mib: int) -> dict[str, Any]:
    """The fleet's placement as JSON: models (state, shape, resident plan), devices, swaps, reasons."""
    from llamafleet.placement.packing import device_use, swaps

    resident = {p.name: p for p in packing.resident}
    evictions = swaps(packing, demands, inventory)
    models: list[dict[str, Any]] = []
    for m in served:
        if m.path is None:  # served by remote members only: nothing placed here
            models.append({"name": m.name, "aliases": list(m.aliases), "path": None, "pinned": True,
                           "idle_ttl_s": None, "remote": [e.url for e in m.remote], "state": "remote", "shape": None,
                           "placement": None, "usage_mib": {}, "evicts": [], "swap_note": ""})
            continue
        state = "resident" if m.name in resident else "swapped" if m.name in evictions else "never"
        models.append({
            "name": m.name, "aliases": list(m.aliases), "path": str(m.path), "pinned": m.pinned,
            "idle_ttl_s": m.idle_ttl_s, "remote": [e.url for e in m.remote], "state": state,
            "shape": packing.shapes[m.name].to_json(),
            "placement": resident[m.name].plan.to_json() if m.name in resident else None,
            "usage_mib": {("CPU" if k < 0 else f"GPU {k}"): v for k, v in resident[m.name].usage.items()}
            if m.name in resident else {},
            "evicts": list(evictions[m.name].evict) if m.name in evictions else [],
            "swap_note": evictions[m.name].reason if m.name in evictions else "",
        })
    devices = [{"device": d.device, "free_mib": d.free_mib, "margin_mib": d.margin_mib, "models": dict(d.models),
                "left_mib": d.left_mib} for d in device_use(packing, inventory, margin_mib)]
    return {"fits": packing.fits, "inventory": inventory.source, "models": models, "devices": devices,
            "reasons": list(packing.reasons)}


def format_fleet(d: dict[str, Any], inventory: Inventory) -> str:
    """:func:`fleet_json`'s answer as text: one row per model, the memory per device, swaps, reasons."""
    from llamafleet.placement.gpus import describe_inventory

    resident = [m for m in d["models"] if m["state"] == "resident"]
    placed = [m for m in d["models"] if m["shape"] is not None]
    together = ("it fits in memory" if len(placed) == 1 and resident else
                f"all {len(placed)} fit in memory together" if len(resident) == len(placed) else
                f"{len(resident)} fit in memory together, in this order, the other {len(placed) - len(resident)} "
                "swap")
    lines = [describe_inventory(inventory), "",
             f"fleet: {'FITS' if d['fits'] else 'DOES NOT FIT'} ({len(d['models'])} model(s); {together}; pinned "
             "models load at start, the rest on demand)"]
    rows = [["model", "pinned", "state", "replicas", "slots x ctx", "where", "file"]]
    for m in d["models"]:
        if m["shape"] is None:
            rows.append([m["name"], "yes", "remote", str(len(m["remote"])), "-", " ".join(m["remote"]), "-"])
            continue
        shape, where = m["shape"], m["placement"] or m["shape"]
        rows.append([m["name"], "yes" if m["pinned"] else "no", m["state"], str(len(where["replicas"])),
                     f"{shape['n_seq']} x {shape['n_ctx_per_seq']}",
                     " ".join(_where(r) for r in where["replicas"]) if m["placement"] else "-", m["path"]])
    lines += table(rows)
    lines.append("memory (MiB) with the models that fit together loaded (on a GPU, each model's MiB include the margin "
                 "of its own worker process):")
    names = [m["name"] for m in resident]
    rows = [["device", "free", "margin", *names, "left"]]
    for dev in d["devices"]:
        rows.append([dev["device"], "?" if dev["free_mib"] is None else str(dev["free_mib"]), str(dev["margin_mib"]),
                     *(str(dev["models"].get(n, "-")) for n in names),
                     "?" if dev["left_mib"] is None else str(dev["left_mib"])])
    lines += table(rows)
    swapped = [m for m in d["models"] if m["state"] == "swapped"]
    if swapped:
        lines.append("swaps (loading a model unloads the least recently used unpinned ones; here, right after start):")
        lines += [f"  - {m['name']}: " + (f"evicts {', '.join(m['evicts'])}" if m["evicts"] else m["swap_note"])
                  for m in swapped]
    if d["reasons"]:
        lines.append("why not:")
        lines += [f"  - {r}" for r in d["reasons"]]
    lines.append("each model's own plan: llamafleet plan --model FILE (with its settings)")
    return "\n".join(lines)


def _where(r: dict[str, Any]) -> str:
    return ",".join(map(str, r["gpus"])) and f"GPU {','.join(map(str, r['gpus']))}" or "CPU"


def _run_fleet(args: argparse.Namespace, cfg: FleetConfig, inventory: Inventory) -> int:
    from llamafleet.catalog import demands, served_models
    from llamafleet.model.demo import default_model_path
    from llamafleet.placement.packing import pack

    served = served_models(cfg, default_model_path)
    packing, fixed = pack(demands(served), inventory)
    d = fleet_json(packing, fixed, served, inventory, cfg.vram_margin_mib)
    print(json.dumps(d, indent=2) if args.json else format_fleet(d, inventory))
    return Exit.OK if packing.fits else Exit.NO


def run(args: argparse.Namespace) -> int:
    # the GGUF reader and the planner (numpy) load here, not when the parser is built for another command
    from llamafleet.catalog import fetched_extras
    from llamafleet.model.demo import ModelFetchError, default_model_path
    from llamafleet.model.header import GgufError
    from llamafleet.model.hub import HubError, model_header
    from llamafleet.model.hub_ref import RefError
    from llamafleet.placement.advice import inapplicable
    from llamafleet.placement.gpus import InventoryError, detect_inventory, load_inventory
    from llamafleet.placement.planner import make_plan
    from llamafleet.placement.rpc_probe import with_rpc

    try:
        cfg = load_config(args.config, overrides(args))
        inventory = with_rpc(load_inventory(args.inventory) if args.inventory else detect_inventory(),
                             cfg.rpc_servers)
        if cfg.models is not None or cfg.models_dir is not None:
            return _run_fleet(args, cfg, inventory)
        remote = [f"{e.url} (max_concurrency {e.max_concurrency})" for e in cfg.remote]
        if remote and cfg.model_path is None:
            print(json.dumps({"fits": True, "replicas": [], "remote": [e.url for e in cfg.remote]}, indent=2)
                  if args.json else "nothing to place here: the model is served by remote members only: "
                  f"{', '.join(remote)}; each places it on its own machine")
            return Exit.OK
        model, _ = model_header(cfg.model_path or default_model_path())
        cfg = fetched_extras(cfg)
    except (ConfigError, InventoryError, RefError) as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.USAGE
    except (GgufError, ModelFetchError, HubError) as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.MODEL
    # a described inventory is another machine's: its core count is not known
    for line in inapplicable(cfg, inventory, None if args.inventory else os.cpu_count()):
        print(f"warning: {line}", file=sys.stderr)
    plan = make_plan(model, inventory, cfg)
    if args.json:
        print(json.dumps({**plan.to_json(), "model_path": model.path, "inventory": inventory.source,
                          "remote": [e.url for e in cfg.remote]}, indent=2))
    else:
        print(format_plan(plan, model, inventory, cfg.cuda_graphs == "auto"))
        if remote:
            print(f"remote members beside these replicas: {', '.join(remote)}")
    return Exit.OK if plan.fits else Exit.NO


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="show how a model would be placed on the GPUs (replicas, split, memory per GPU); exit 1 if it won't fit",
        description="Plan a model's placement from its GGUF header and the GPU inventory; nothing is loaded.",
        epilog="exit codes: 0 the plan fits, 1 it does not (the reasons say what would), 2 a bad flag or config "
        "value, 3 the model file cannot be read (docs/OPERATIONS.md, Exit codes).",
    )
    p.add_argument("--inventory", metavar="FILE", help="plan for the GPUs described in this YAML instead of this "
                   "machine's (see examples/inventories/)")
    add_config_flag(p)
    add_flags(p, "plan")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)
