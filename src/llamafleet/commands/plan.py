"""``llamafleet plan``: show how a model would be placed on this machine's GPUs (or a described one); exit 0 if it
fits, 1 if not, 2 on bad input."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llamafleet.config import ConfigError, inapplicable, load_config
from llamafleet.flags import add_config_flag, add_flags, overrides

if TYPE_CHECKING:
    from llamafleet.model.header import ModelInfo
    from llamafleet.placement.gpus import Inventory
    from llamafleet.placement.planner import Plan


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def format_plan(plan: Plan, model: ModelInfo, inventory: Inventory) -> str:
    """The plan as a few readable sections: verdict, replicas, context, memory per device, reasons, warnings."""
    from llamafleet.placement.gpus import describe_inventory

    lines = [
        f"model: {model.path}",
        f"  {model.name}: {model.architecture}, {model.file_type}, {model.n_layer} layers, {model.n_embd} embd, "
        f"{model.n_head}/{model.n_head_kv} heads/KV heads, trained context {model.n_ctx_train}",
        describe_inventory(inventory),
        "",
        f"plan: {'FITS' if plan.fits else 'DOES NOT FIT'} ({len(plan.replicas)} replica(s) on the {plan.device})",
    ]
    if plan.replicas:
        rows = [["replica", "gpus", "split", "tensor_split", "main_gpu"]]
        for i, r in enumerate(plan.replicas):
            rows.append([str(i), ",".join(map(str, r.gpus)) or "cpu", r.split_mode,
                         ",".join(f"{x:.4g}" for x in r.tensor_split) or "-", str(r.main_gpu) if r.gpus else "-"])
        lines += _table(rows)
    fa = {None: "auto", True: "on", False: "off"}[plan.flash_attn]
    lines.append(f"context: {plan.n_seq} slots x {plan.n_ctx_per_seq} tokens per replica; n_batch {plan.n_batch}, "
                 f"n_ubatch {plan.n_ubatch}; KV cache {plan.kv_type}; flash attention {fa}")
    if plan.budgets:
        lines.append("memory (MiB):")
        rows = [["device", "replica", "weights", "kv", "compute", "margin", "total", "free", "left"]]
        for b in plan.budgets:
            left = "?" if b.capacity_mib is None else str(b.capacity_mib - b.used_mib)
            rows.append([b.device, "-" if b.replica is None else str(b.replica), str(b.weights_mib), str(b.kv_mib),
                         str(b.compute_mib), str(b.margin_mib), str(b.used_mib),
                         "?" if b.capacity_mib is None else str(b.capacity_mib), left])
        lines += _table(rows)
    if plan.host_mib:
        lines.append(f"host memory per replica: {plan.host_mib} MiB (token embedding, logits)")
    lines.append("why:")
    lines += [f"  - {r}" for r in plan.reasons]
    if plan.warnings:
        lines.append("warnings:")
        lines += [f"  - {w}" for w in plan.warnings]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # the GGUF reader and the planner (numpy) load here, not when the parser is built for another command
    from llamafleet.model.demo import ModelFetchError, default_model_path
    from llamafleet.model.header import GgufError, read_model_info
    from llamafleet.placement.gpus import InventoryError, detect_inventory, load_inventory
    from llamafleet.placement.planner import make_plan

    try:
        cfg = load_config(args.config, overrides(args))
        model = read_model_info(Path(cfg.model_path) if cfg.model_path else default_model_path())
        inventory = load_inventory(args.inventory) if args.inventory else detect_inventory()
    except (ConfigError, GgufError, InventoryError, ModelFetchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # a described inventory is another machine's: its core count is not known
    for line in inapplicable(cfg, inventory, None if args.inventory else os.cpu_count()):
        print(f"warning: {line}", file=sys.stderr)
    plan = make_plan(model, inventory, cfg)
    if args.json:
        print(json.dumps({**plan.to_json(), "model_path": model.path, "inventory": inventory.source}, indent=2))
    else:
        print(format_plan(plan, model, inventory))
    return 0 if plan.fits else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="show how a model would be placed on the GPUs (replicas, split, memory per GPU); exit 1 if it won't fit",
        description="Plan a model's placement from its GGUF header and the GPU inventory; nothing is loaded.",
        epilog="exit codes: 0 the plan fits, 1 it does not (the reasons say what would), 2 bad input.",
    )
    p.add_argument("--inventory", metavar="FILE", help="plan for the GPUs described in this YAML instead of this "
                   "machine's (see examples/inventories/)")
    add_config_flag(p)
    add_flags(p, "plan")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)
