"""``llamafleet`` command line: one sub-command per module in :mod:`llamafleet.commands`.

Building the parser imports every command module, so those import only what their flags need (argparse, the config
and :mod:`llamafleet.flags`); each loads its heavy modules (FastAPI, matplotlib, numpy, llama.cpp) inside its
``run``. So ``llamafleet serve`` never loads matplotlib, and ``llamafleet check-env`` can report a missing package.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from llamafleet import __version__

# Each module defines ``register(sub)``, which adds its parser and sets ``func``, its ``run(args) -> int``.
COMMANDS = ("serve", "plan", "synth", "bench", "consistency", "check_env", "model", "rpc_server")
# Commands that load a model in this process: llama.cpp must be loaded before the commands import numpy
# (see engine/llama.py's docstring).
IN_PROCESS_MODEL = (("bench", "engine"),)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llamafleet",
        description="Serve LLaMA-family GGUF models across every GPU of a machine.",
    )
    parser.add_argument("--version", action="version", version=f"llamafleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"llamafleet.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return 130


def _main(argv: list[str] | None) -> int:
    words = tuple(sys.argv[1:] if argv is None else argv)
    if any(words[: len(cmd)] == cmd for cmd in IN_PROCESS_MODEL):
        import llamafleet.engine.llama  # noqa: F401
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    logging.basicConfig(
        level=getattr(args, "log_level", "info").upper() if isinstance(getattr(args, "log_level", None), str)
        else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        rc: int = args.func(args)
    except ModuleNotFoundError as e:
        package = (e.name or "llamafleet").split(".")[0]
        if package == "llamafleet":
            raise
        print(f"error: the Python package {package!r} is not installed, and `llamafleet {args.command}` needs it; "
              "`llamafleet check-env` lists what is missing, and scripts/install.sh installs it", file=sys.stderr)
        return 2
    return rc


if __name__ == "__main__":
    sys.exit(main())
