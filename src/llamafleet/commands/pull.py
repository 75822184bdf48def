"""``llamafleet pull REF``: fetch a model from the Hugging Face hub into the hub cache, and print its path."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from llamafleet.exits import Exit
from llamafleet.model.hub_ref import FORMS, HubRef

DESCRIPTION = """Fetch a GGUF model from the Hugging Face hub (or HF_ENDPOINT's mirror) into the hub cache shared by
every Hugging Face tool of this machine (HF_HUB_CACHE, default ~/.cache/huggingface/hub), and print the path of its
file (a split model's first part) on stdout. A model already cached is not fetched again; a download cut off
resumes; each new file is checked against the hub's sha256; a download that would fill the disk is refused before
it starts. Gated and private repos need HF_TOKEN.

references:
""" + "\n".join(f"  {f}" for f in FORMS)


def for_each_ref(words: list[str], act: Callable[[HubRef], None]) -> int:
    """``act`` on each reference (all parsed first): the exit code, USAGE for a malformed one (nothing done), MODEL
    at the first that fails."""
    from llamafleet.model.hub import HubError
    from llamafleet.model.hub_ref import RefError, parse_ref

    try:
        refs = [parse_ref(w) for w in words]
    except RefError as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.USAGE
    for ref in refs:
        try:
            act(ref)
        except HubError as e:
            print(f"error: {e}", file=sys.stderr)
            return Exit.MODEL
    return Exit.OK


def _pull(ref: HubRef) -> None:
    from llamafleet.model.hub import cache_root, fetch, gib, resolve

    hub = resolve(ref)
    need = sum(f.size for f in hub.missing())
    print(f"{ref}: {', '.join(f.name for f in hub.files)} at commit {hub.commit[:12]}, {gib(hub.size)}"
          + (f"; fetching {gib(need)} into {cache_root()}" if need else "; already in the cache"),
          file=sys.stderr, flush=True)
    print(fetch(hub), flush=True)


def run(args: argparse.Namespace) -> int:
    return for_each_ref(args.ref, _pull)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pull", help="fetch a model from the Hugging Face hub (hf:ORG/REPO:QUANT) into the cache",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ref", nargs="+", metavar="REF", help="a model reference, e.g. hf:ORG/REPO:Q4_K_M")
    p.set_defaults(func=run)
