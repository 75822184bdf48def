"""``llamafleet plan | head``: a command whose reader goes away stops quietly (exit 141, as a program ended by
SIGPIPE), with no traceback; a broken pipe that is not its output's is still a bug and shows as one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import llamafleet.commands.plan
from llamafleet.cli import main
from llamafleet.exits import Exit
from synth_models import sparse_models


def run_into_closed_reader(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Run ``llamafleet ARGV`` with its stdout a pipe whose reading end is already closed."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "llamafleet.cli", *argv], stdout=write, stderr=subprocess.PIPE,
                              timeout=120)
    finally:
        os.close(write)


def test_plan_into_a_closed_reader_exits_quietly(tmp_path_factory: pytest.TempPathFactory) -> None:
    inventory = tmp_path_factory.mktemp("inventory") / "cpu-box.yaml"
    inventory.write_text("gpus: []\nhost_mem_mib: 16000\n", encoding="utf-8")
    model = sparse_models(tmp_path_factory)["7b-q4_0"].path
    done = run_into_closed_reader(["plan", "--model", model, "--inventory", str(inventory)])
    assert done.returncode == Exit.PIPE, done.stderr.decode()
    assert done.stderr == b""


def test_check_env_into_a_closed_reader_exits_quietly() -> None:
    done = run_into_closed_reader(["check-env", "--json"])
    assert done.returncode == Exit.PIPE, done.stderr.decode()
    assert done.stderr == b""


def test_a_broken_pipe_that_is_not_the_output_still_raises(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    def broken(args: object) -> int:
        raise BrokenPipeError("a worker's pipe")

    monkeypatch.setattr(llamafleet.commands.plan, "run", broken)
    with pytest.raises(BrokenPipeError, match="a worker's pipe"):
        main(["plan", "--model", str(tmp_path / "any.gguf")])
