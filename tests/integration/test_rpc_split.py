"""One model split over this host's CPU and a real llama.cpp RPC server (``llamafleet rpc-server`` on 127.0.0.1).

The split must not change a single greedy token; an RPC server that is down when a replica loads is a load error
that names it (llama.cpp itself would abort the worker); one killed while serving takes the replica down, and the
supervision brings it back once a server answers on that address again. All traffic stays on loopback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llamafleet.engine.engine import Engine  # isort: skip  (llama.cpp before numpy: see engine/llama.py)

from conftest import FleetServer, free_port
from llamafleet.engine.types import EngineConfig, Request, SamplingParams
from llamafleet.rpc import check_reachable

PROMPTS = ["The capital of France is", "def fibonacci(n):", "中国的首都是", "To make a cup of tea, first"]
GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


class RpcServer:
    """``llamafleet rpc-server`` on 127.0.0.1 at a free port, in its own process group."""

    def __init__(self, log_path: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llamafleet.cli", "rpc-server", "--port", str(self.port), "--threads", "1"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(ConnectionError):
                check_reachable(self.endpoint, timeout_s=1.0)
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"rpc-server did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def rpc_server(tmp_path: Path) -> Iterator[RpcServer]:
    server = RpcServer(tmp_path / "rpc-server.log")
    yield server
    server.kill()


def _generate(cfg: EngineConfig) -> list[list[int]]:
    with Engine(cfg) as eng:
        out = eng.generate([Request(str(i), tuple(eng.tokenize(p)), GREEDY) for i, p in enumerate(PROMPTS)])
    return [out[str(i)].token_ids for i in range(len(PROMPTS))]


def test_rpc_split_gives_the_unsplit_models_greedy_tokens(model_path: Path, rpc_server: RpcServer,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    base = EngineConfig(model_path=str(model_path), n_seq=4, n_ctx_per_seq=256, n_batch=256, n_threads=1,
                        n_gpu_layers=0, llama_log_level="info")
    alone = _generate(base)
    with caplog.at_level(logging.INFO, logger="llamafleet.llama_cpp"):
        split = _generate(EngineConfig(**{**base.__dict__, "rpc_servers": (rpc_server.endpoint,),
                                          "n_gpu_layers": -1, "split_mode": "layer", "tensor_split": (0.5, 0.5)}))
    # half the layers really went to the RPC server (llama.cpp names its buffers there), the rest to this CPU
    assert "offloaded 31/31 layers" in caplog.text
    assert re.search(rf"RPC\d+\[{rpc_server.endpoint}\] model buffer size = +[1-9]", caplog.text)
    assert all(len(t) == 32 for t in alone)
    assert split == alone


def _serve(launch_fleet: Callable[[list[str]], FleetServer], model_path: Path, tmp_path: Path,
           endpoint: str) -> FleetServer:
    config = tmp_path / "fleet.yaml"
    config.write_text(f"rpc_servers: ['{endpoint}']\nrpc_trusted_network: true\nsplit_mode: layer\n")
    return launch_fleet(["--config", str(config), "--model", str(model_path), "--parallel", "2", "--ctx", "512",
                         "--threads", "1"])


def test_rpc_fleet_serves_split_and_recovers_after_the_rpc_server_dies(
        launch_fleet: Callable[[list[str]], FleetServer], model_path: Path, tmp_path: Path,
        rpc_server: RpcServer) -> None:
    fleet = _serve(launch_fleet, model_path, tmp_path, rpc_server.endpoint)
    body = fleet.wait_ready()
    assert "CPU + RPC 127.0.0.1" in fleet.log()  # the replica's label: this host's CPU and the RPC server
    client, model = fleet.client(), fleet.model()
    first = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=16, temperature=0)
    assert first.choices[0].text
    pid = body["replicas"][0]["pid"]

    rpc_server.kill()  # mid-service: the next step's RPC fails, llama.cpp aborts the worker
    with contextlib.suppress(Exception):
        client.completions.create(model=model, prompt=PROMPTS[1], max_tokens=16, temperature=0)
    deadline = time.monotonic() + 60
    while fleet.ready()[1]["replicas"][0]["status"] == "ready" and time.monotonic() < deadline:
        time.sleep(0.2)
    down = fleet.ready()
    assert down[0] == 503 and down[1]["replicas"][0]["status"] != "ready"
    while "is unreachable" not in fleet.log() and time.monotonic() < deadline:  # a reload failed, saying why
        time.sleep(0.2)
    assert f"RPC server {rpc_server.endpoint} (config key rpc_servers) is unreachable" in fleet.log()

    again = RpcServer(tmp_path / "rpc-server-2.log", port=rpc_server.port)  # back on the same address
    try:
        back = fleet.wait_all_ready(timeout=120)["replicas"][0]
        assert back["pid"] != pid and back["restarts"] >= 2
        after = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=16, temperature=0)
        assert after.choices[0].text == first.choices[0].text
    finally:
        fleet.stop()  # before the RPC server: a worker whose server vanishes aborts in llama.cpp
        again.kill()


def test_rpc_server_down_at_load_is_a_load_error_naming_it(
        launch_fleet: Callable[[list[str]], FleetServer], model_path: Path, tmp_path: Path) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    fleet = _serve(launch_fleet, model_path, tmp_path, nobody)
    assert fleet.proc.wait(timeout=120) != 0
    assert f"RPC server {nobody} (config key rpc_servers) is unreachable" in fleet.log()


def test_rpc_server_warns_loudly_off_loopback() -> None:
    # 192.0.2.1 is a documentation address (RFC 5737), never this host's: the warning, then a clean bind failure
    done = subprocess.run([sys.executable, "-m", "llamafleet.cli", "rpc-server", "--host", "192.0.2.1", "--port",
                           str(free_port())], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "WARNING: rpc-server listens on 192.0.2.1, not 127.0.0.1" in done.stderr
    assert "no authentication and no encryption" in done.stderr
    assert "could not start on 192.0.2.1:" in done.stderr
