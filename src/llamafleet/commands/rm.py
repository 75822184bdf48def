"""``llamafleet rm REF``: remove a model from the hub cache."""

from __future__ import annotations

import argparse

from llamafleet.commands.pull import for_each_ref
from llamafleet.model.hub_ref import HubRef


def _rm(ref: HubRef) -> None:
    from llamafleet.model.hub import gib
    from llamafleet.model.store import remove

    for s in remove(ref):
        print(f"removed {s.ref} (commit {s.commit[:12]}, {gib(s.size)})")


def run(args: argparse.Namespace) -> int:
    return for_each_ref(args.ref, _rm)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rm", help="remove a model from the Hugging Face hub cache",
                       description="Remove the models a reference names from the hub cache (HF_HUB_CACHE): their "
                       "files, and the blobs no other cached file uses. hf:ORG/REPO removes every model of the repo; "
                       "@REVISION only that commit's. `llamafleet models` lists what is cached.")
    p.add_argument("ref", nargs="+", metavar="REF", help="a model reference, e.g. hf:ORG/REPO:Q4_K_M")
    p.set_defaults(func=run)
