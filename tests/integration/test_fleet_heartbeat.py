"""A hung worker on a real 2-replica server: frozen with SIGSTOP, it falls silent; within seconds it is suspect (new
work goes to the other replica, see test_fleet_suspect.py), and within the heartbeat timeout the API process fails
what it still held (its running stream) with 503, kills it, restarts it, and counts it in /metrics.

Without the heartbeat a frozen worker stayed "ready" and kept receiving about half the requests, which waited for it
until their own timeout (10 minutes by default).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from stream_thread import HEADER, StreamThread

from conftest import FleetServer

TIMEOUT_S = 4.0  # the server's heartbeat_timeout_s in this test (suspect_after_s stays 2: suspect comes first)


def _worker_pids(server: FleetServer) -> set[int]:
    """The server's worker processes (multiprocessing spawn children), found through /proc."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server.proc.pid and "spawn_main" in cmdline and "resource_tracker" not in cmdline:
            pids.add(int(entry.name))
    return pids


def _metric(server: FleetServer, name: str) -> dict[str, float]:
    """``name``'s value per replica label."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return {m[1]: float(m[2]) for m in re.finditer(rf'^{name}\{{replica="(\d+)"\}} (\S+)$', text, re.M)}


def _complete(server: FleetServer, n: int = 1) -> httpx.Response:
    body = {"model": server.model(), "prompt": "1, 2, 3,", "max_tokens": 4, "temperature": 0, "n": n}
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)


class _StatusWatch(threading.Thread):
    """Polls /ready and keeps every replica status it sees ("suspect" for a ready one that is)."""

    def __init__(self, server: FleetServer) -> None:
        super().__init__(daemon=True)
        self.server, self.seen = server, set[str]()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(httpx.HTTPError):
                self.seen.update("suspect" if r["suspect"] else r["status"] for r in self.server.ready()[1]["replicas"])
            time.sleep(0.05)


def test_a_frozen_worker_is_noticed_routed_around_killed_and_restarted(
        launch_fleet: Callable[[list[str]], FleetServer], model_path: Path, tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(f"heartbeat_timeout_s: {TIMEOUT_S}\n")
    server = launch_fleet(["--config", str(config), "--model", str(model_path), "--replicas", "2", "--parallel", "2",
                           "--ctx", "512", "--threads", "1"])
    server.wait_ready()
    pids = _worker_pids(server)
    assert len(pids) == 2, pids
    time.sleep(TIMEOUT_S + 2)  # idle, healthy workers are not mistaken for hung ones (a silent one is killed by 4.25 s)
    assert _metric(server, "llamafleet_replica_hangs_total") == {"0": 0, "1": 0}

    stream = StreamThread(server.url, server.model(), max_tokens=400)
    stream.start()
    assert stream.started.wait(120) and stream.status == 200
    hung_index = int(stream.replica)
    victim = next(r["pid"] for r in server.ready()[1]["replicas"] if r["index"] == hung_index)
    assert victim in pids
    watch = _StatusWatch(server)
    watch.start()
    os.kill(victim, signal.SIGSTOP)
    t0 = time.monotonic()
    r = _complete(server, n=2)  # whatever was routed to the frozen replica moves once it is suspect
    assert r.status_code == 200 and r.headers[HEADER] == f"{1 - hung_index},{1 - hung_index}", r.text
    stream.join(TIMEOUT_S + 30)  # the stream it was running stays there, and fails when it is found hung
    noticed = time.monotonic() - t0
    message = stream.error or ""
    assert "heartbeat_timeout_s" in message and "retry" in message, (stream.error, stream.finish)
    assert noticed < TIMEOUT_S + 3, f"the frozen worker was noticed after {noticed:.1f}s"

    served = [_complete(server) for _ in range(5)]  # while the hung replica restarts, the other serves everything
    assert [x.status_code for x in served] == [200] * 5, [x.text for x in served]
    assert time.monotonic() - t0 < TIMEOUT_S + 10

    server.wait_all_ready(timeout=120)
    watch.done.set()
    watch.join(10)
    assert {"suspect", "unresponsive"} <= watch.seen, watch.seen
    after = _worker_pids(server)
    assert victim not in after and len(after) == 2
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(victim, 0)
    hangs = _metric(server, "llamafleet_replica_hangs_total")
    assert sorted(hangs.values()) == [0, 1], hangs
    hung = next(k for k, v in hangs.items() if v)
    assert hung == str(hung_index) and _metric(server, "llamafleet_replica_suspect_total")[hung] == 1
    assert _metric(server, "llamafleet_replica_restarts_total")[hung] == 1
    assert f"replica {hung} worker" in message

    r = _complete(server, n=2)  # and the restarted replica serves again
    assert r.status_code == 200 and sorted(r.headers[HEADER].split(",")) == ["0", "1"], r.text
