"""``llamafleet serve --config``: the seed's YAML starts a server; a bad YAML is refused before anything loads;
Ctrl-C stops the server cleanly with no worker left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from conftest import FleetServer, free_port
from llamafleet.placement.gpus import detect_inventory

REPO = Path(__file__).resolve().parents[2]
SEED_MODEL = "/data/models/llama-2-13b-chat.Q8_0.gguf"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_seed_yaml_serves_and_ctrl_c_stops_cleanly(launch_fleet: Callable[[list[str]], FleetServer],
                                                   model_path: Path, tmp_path: Path) -> None:
    seed = (REPO / "examples" / "fleet.yaml").read_text(encoding="utf-8")
    assert SEED_MODEL in seed
    config = tmp_path / "fleet.yaml"
    config.write_text(seed.replace(SEED_MODEL, str(model_path)), encoding="utf-8")
    # flags override the file: one slot keeps the seed's 4096-token context small in memory
    server = launch_fleet(["--config", str(config), "--parallel", "1"])
    ready = server.wait_ready()
    assert all(r["slots"] == 1 for r in ready["replicas"])
    model = ready["model"]
    assert model == model_path.stem
    log = server.log()
    assert server.url in log and "/v1/chat/completions" in log and "/api/generate" in log
    # keys that cannot apply here are said (the file sets main_gpu: 0, split_ratio and threads: 8)
    if not detect_inventory().gpus:
        assert "warning: main_gpu is set but this machine has no GPU" in log
        assert "warning: split_ratio is set but this machine has no GPU" in log
    if (os.cpu_count() or 1) < 8:
        assert f"warning: threads 8 is more than this machine's {os.cpu_count()} CPU cores" in log

    too_long = httpx.post(f"{server.url}/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 5000},
                          timeout=60)
    assert too_long.status_code == 400 and "context per sequence (4096)" in too_long.text  # the YAML's context

    client = server.client()
    stream = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=24, temperature=0, stream=True)
    first = next(iter(stream))  # a request in flight when Ctrl-C comes
    workers = [r["pid"] for r in ready["replicas"]]
    os.killpg(server.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    rest = list(stream)
    assert rest[-1].choices[0].finish_reason == "length"  # it was allowed to finish
    assert first.choices[0].text + "".join(c.choices[0].text for c in rest)
    assert server.proc.wait(60) == 0
    assert not any(_alive(pid) for pid in workers), "a worker outlived the server"


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("context_lenght: 2048", "unknown key 'context_lenght'"),
        ("batch_size: plenty", "'batch_size'"),
        ("split_ratio: half", "'split_ratio'"),
    ],
)
def test_bad_yaml_is_refused_before_loading(model_path: Path, tmp_path: Path, line: str, named: str) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(f"model_path: {model_path}\n{line}\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "llamafleet.cli", "serve", "--config", str(config),
                           "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr and str(config) in proc.stderr
    assert "loading" not in proc.stdout + proc.stderr


def test_missing_model_file_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    proc = subprocess.run([sys.executable, "-m", "llamafleet.cli", "serve", "--model", str(missing),
                           "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and "model file not found" in proc.stderr and str(missing) in proc.stderr


def test_the_server_never_loads_matplotlib(fleet: FleetServer) -> None:
    """The real server, serving: none of matplotlib's compiled modules is mapped into its process."""
    maps = Path(f"/proc/{fleet.proc.pid}/maps").read_text()
    assert "/numpy/" in maps  # compiled modules of the packages it imported do show here
    assert "/matplotlib/" not in maps
