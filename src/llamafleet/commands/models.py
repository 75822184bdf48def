"""``llamafleet models``: the GGUF models in the hub cache (name, size, quant, path), and which model of a served
configuration uses each."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llamafleet.exits import Exit
from llamafleet.flags import add_config_flag

if TYPE_CHECKING:
    from llamafleet.config import FleetConfig
    from llamafleet.model.store import Stored


def _used_by(cfg: FleetConfig, s: Stored) -> list[str]:
    """The names of the configuration's models that load ``s``: by hub reference, or by its path."""
    from llamafleet.model.hub_ref import is_ref, parse_ref

    named = [(e.name, e.path) for e in cfg.models or () if e.path]
    if cfg.model_path:
        named.append((cfg.model_name or "model_path", cfg.model_path))
    out = []
    for name, source in named:
        hit = s.matches(parse_ref(source)) if is_ref(source) else Path(source).resolve() == s.path.resolve()
        if hit:
            out.append(name)
    return out


def run(args: argparse.Namespace) -> int:
    from llamafleet.commands.plan import table
    from llamafleet.config import ConfigError, load_config
    from llamafleet.model.hub import cache_root
    from llamafleet.model.hub_ref import RefError
    from llamafleet.model.store import stored

    models = stored()
    try:
        cfg = load_config(args.config) if args.config else None
        used = {s.ref: _used_by(cfg, s) if cfg else [] for s in models}
    except (ConfigError, RefError) as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.USAGE
    if args.json:
        print(json.dumps([{"ref": s.ref, "repo": s.repo, "commit": s.commit, "refs": list(s.refs),
                           "files": list(s.files), "size": s.size, "quant": s.quant, "path": str(s.path),
                           "used_by": used[s.ref]} for s in models], indent=2))
        return Exit.OK
    if not models:
        print(f"no GGUF model in the hub cache ({cache_root()}); `llamafleet pull hf:ORG/REPO:QUANT` fetches one")
        return Exit.OK
    rows = [["model", "size", "quant", *(["used by"] if cfg else []), "path"]]
    for s in models:
        rows.append([s.ref + (f" ({len(s.files)} parts)" if len(s.files) > 1 else ""), f"{s.size / 1e9:.2f} GB",
                     s.quant, *([", ".join(used[s.ref]) or "-"] if cfg else []), str(s.path)])
    print("\n".join(table(rows)))
    return Exit.OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("models", help="list the GGUF models in the Hugging Face hub cache (name, size, quant, path)",
                       description="List the GGUF models in the hub cache shared by every Hugging Face tool of this "
                       "machine (HF_HUB_CACHE): one row per model and commit, a split model's parts as one. With "
                       "--config, which of that configuration's models uses each.")
    add_config_flag(p)
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=run)
