"""``llamafleet model``: fetch the built-in demo model and print its path (``model fetch``/``model path``)."""

from __future__ import annotations

import argparse

from llamafleet.model.demo import ModelFetchError, default_model_path


def _run(args: argparse.Namespace) -> int:
    try:
        path = default_model_path(progress=not args.quiet)
    except ModelFetchError as e:
        print(f"error: {e}")
        return 1
    print(path)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("model", help="fetch the built-in demo model (SmolLM2-135M-Instruct) and print its path")
    p.add_argument("action", nargs="?", choices=["fetch", "path"], default="path")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
