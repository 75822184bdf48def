"""``llamafleet`` command line: one sub-command per module in :mod:`llamafleet.commands`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from llamafleet import __version__

# Each module defines ``register(subparsers)``, which adds its parser and sets ``func(args) -> int``.
COMMANDS = ("serve", "plan", "synth", "bench", "consistency", "check_env", "model")
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
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
