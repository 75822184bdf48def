"""``llamafleet`` command line: one sub-command per module in :mod:`llamafleet.commands`.

Building the parser imports every command module (a command's own process, only its module), so those import only
what their flags need (argparse, the config and :mod:`llamafleet.flags`); each loads its heavy modules (FastAPI,
matplotlib, numpy, llama.cpp) inside its ``run``. So ``llamafleet serve`` never loads matplotlib, and ``llamafleet
check-env`` can report a missing package.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import select
import sys
from typing import TextIO

from llamafleet import __version__
from llamafleet.exits import Exit

# Each module defines ``register(sub)``, which adds its parser and sets ``func``, its ``run(args) -> int``.
COMMANDS = ("serve", "plan", "pull", "models", "rm", "synth", "bench", "consistency", "check_env", "model",
            "rpc_server", "keys")
# Commands that load a model in this process: llama.cpp must be loaded before the commands import numpy
# (see engine/llama.py's docstring).
IN_PROCESS_MODEL = (("bench", "engine"),)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``only`` (a command's module name) alone: a command's process imports no
    other command's flags (``serve``'s config and pydantic models cost a ``pull`` about a quarter second of CPU)."""
    parser = argparse.ArgumentParser(
        prog="llamafleet",
        description="Serve LLaMA-family GGUF models across every GPU of a machine.",
    )
    parser.add_argument("--version", action="version", version=f"llamafleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else (only,):
        importlib.import_module(f"llamafleet.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        rc = _main(argv)
        sys.stdout.flush()  # here, not at the interpreter's exit, so that a reader gone by now is handled below
        return rc
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except BrokenPipeError:
        if not any(_reader_gone(s) for s in (sys.stdout, sys.stderr)):
            raise  # another pipe (a bug's, not the user's `| head`): its traceback is wanted
        for stream in (sys.stdout, sys.stderr):  # what is still buffered for it can go nowhere: drop it quietly
            if _reader_gone(stream):
                os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        return Exit.PIPE


def _reader_gone(stream: TextIO) -> bool:
    """Whether ``stream`` is a pipe whose reader has closed it (``llamafleet plan | head``, after ``head`` exits)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # replaced by something that is no file (pytest's capture)
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _main(argv: list[str] | None) -> int:
    words = tuple(sys.argv[1:] if argv is None else argv)
    if any(words[: len(cmd)] == cmd for cmd in IN_PROCESS_MODEL):
        import llamafleet.engine.llama  # noqa: F401
    named = {name.replace("_", "-"): name for name in COMMANDS}.get(words[0]) if words else None
    parser = build_parser(named)  # a word that is no command (a typo, --help): every command's usage
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _refuse_unknown(parser, list(words), unknown)
    if not getattr(args, "func", None):
        parser.print_help()
        return Exit.USAGE
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
        return Exit.MACHINE
    return rc


def _refuse_unknown(parser: argparse.ArgumentParser, words: list[str], unknown: list[str]) -> None:
    """Exit (2) naming the first word the command does not take, with the command's own usage and, for a misspelt
    flag, the nearest one it does take (``--paralel``: did you mean ``--parallel``?)."""
    command = parser
    for word in words:  # down the sub-commands named (`bench engine`)
        sub = next((a for a in command._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        command = sub.choices[word]
    word = unknown[0]
    flags = [o for a in command._actions if a.help != argparse.SUPPRESS for o in a.option_strings]
    near = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1) if word.startswith("--") else []
    hint = f": did you mean {near[0]}?" if near else f" (`{command.prog} --help` lists what it takes)"
    command.error(f"unrecognized argument {word}{hint}")


if __name__ == "__main__":
    sys.exit(main())
