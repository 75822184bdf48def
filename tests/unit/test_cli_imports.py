"""The commands load their heavy modules only when they run: ``llamafleet serve`` never loads matplotlib, and
``llamafleet check-env`` reports a missing package instead of dying on its ImportError. Each case runs the real CLI
in a child Python, so the modules other tests loaded do not count."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from llamafleet.cli import COMMANDS, build_parser

# Runs the CLI with ARGV, with the packages in BLOCK uninstalled as far as this process can tell (no import, no
# distribution metadata), then prints the top-level modules it loaded.
WRAPPER = """
import importlib.abc, importlib.metadata as md, json, sys
argv, block = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))

class Uninstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in block:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Uninstalled())
real_version = md.version
def version(name):
    if name.lower() in block:
        raise md.PackageNotFoundError(name)
    return real_version(name)
md.version = version

from llamafleet.cli import main
try:
    rc = main(argv)
finally:
    print("MODULES " + json.dumps(sorted({m.split(".")[0] for m in sys.modules})), flush=True)
sys.exit(rc)
"""

HEAVY = {"matplotlib", "fastapi", "uvicorn", "starlette", "httpx", "numpy", "gguf", "llama_cpp"}


def cli(argv: list[str], block: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    proc = subprocess.run([sys.executable, "-c", WRAPPER, json.dumps(argv), json.dumps(block)],
                          capture_output=True, text=True, timeout=240)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("MODULES "))
    return proc, set(json.loads(line.removeprefix("MODULES ")))


def test_serve_does_not_load_matplotlib(model_path: Path) -> None:
    with socket.socket() as busy:  # serve checks config, keys, model and plan, then stops at the busy port
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc, loaded = cli(["serve", "--model", str(model_path), "--port", str(port)])
    assert proc.returncode == 4 and "cannot listen on" in proc.stderr, proc.stderr[-2000:]  # Exit.MACHINE
    assert "matplotlib" not in loaded
    assert "numpy" in loaded  # the planner ran: the check covered more than the parser


def test_building_the_parser_loads_nothing_heavy() -> None:
    proc, loaded = cli(["--version"])
    assert proc.returncode == 0 and not loaded & HEAVY, loaded & HEAVY


def test_check_env_reports_missing_packages(tmp_path: Path) -> None:
    proc, loaded = cli(["check-env", "--json", "--cpu-only"], block=("fastapi", "matplotlib"))
    assert proc.returncode == 2, proc.stderr[-2000:]  # a missing package is a failure, reported
    report = json.loads(proc.stdout[: proc.stdout.index("MODULES ")])
    packages = next(r for r in report["checks"] if r["name"] == "packages")
    assert packages["status"] == "fail"
    assert "not installed: fastapi (for llamafleet), matplotlib (for llamafleet)" in packages["detail"]
    assert not loaded & HEAVY, loaded & HEAVY  # check-env's own imports stay light


def test_a_command_missing_a_package_says_which(tmp_path: Path) -> None:
    proc, _ = cli(["bench", "--compare", "a.json", "b.json"], block=("matplotlib",))
    assert proc.returncode == 4  # Exit.MACHINE: this machine lacks it
    assert "the Python package 'matplotlib' is not installed, and `llamafleet bench` needs it" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_command_builds_its_own_parser_only() -> None:
    """``llamafleet pull`` does not import ``serve``'s flags (the config's pydantic models and YAML): a quarter
    second less of every such command's start."""
    proc, loaded = cli(["pull", "--help"])
    assert proc.returncode == 0 and proc.stdout.startswith("usage: llamafleet pull"), proc.stderr[-2000:]
    assert not loaded & {"pydantic", "yaml"}, loaded & {"pydantic", "yaml"}


@pytest.mark.parametrize("name", COMMANDS)
def test_a_command_s_own_parser_is_the_one_of_the_whole_cli(name: str) -> None:
    def usage(parser: argparse.ArgumentParser) -> str:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return sub.choices[name.replace("_", "-")].format_help()

    assert usage(build_parser(name)) == usage(build_parser())
