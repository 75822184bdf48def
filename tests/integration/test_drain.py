"""Stopping a real server while requests run past its drain: each ends with a 503 that says why (a stream: an error
event, then ``data: [DONE]``), the log says so in one line and shows no traceback, and the server exits 0."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from scrape import metric, scrape

from conftest import FleetServer

DRAIN_S = 2


def test_requests_running_when_the_drain_ends_get_a_503_and_done(launch_fleet: Callable[[list[str]], FleetServer],
                                                                   model_path: Path, tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(f"drain_timeout_s: {DRAIN_S}\n", encoding="utf-8")
    server = launch_fleet(["--config", str(config), "--model", str(model_path), "--replicas", "1", "--parallel", "2",
                           "--ctx", "2048", "--threads", "1"])
    model = server.wait_ready()["model"]
    long = {"model": model, "prompt": "1, 2, 3,", "max_tokens": 2000, "ignore_eos": True}
    events: list[str] = []
    whole: list[httpx.Response] = []
    started = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{server.url}/v1/completions", json={**long, "stream": True}, timeout=60) as s:
            for line in s.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    started.set()

    readers = [threading.Thread(target=stream),
               threading.Thread(target=lambda: whole.append(httpx.post(f"{server.url}/v1/completions", json=long,
                                                                       timeout=60)))]
    for reader in readers:
        reader.start()
    assert started.wait(30), "the stream never started"
    deadline = time.monotonic() + 30
    while metric(scrape(server.url), "llamafleet_replica_outstanding", replica="0") < 2:
        assert time.monotonic() < deadline, "the second request never started"
        time.sleep(0.1)
    t0 = time.monotonic()
    assert server.stop(signal.SIGTERM, timeout=30) == 0
    assert time.monotonic() - t0 < DRAIN_S + 12
    for reader in readers:
        reader.join(10)
    assert events[-1] == "data: [DONE]", events[-3:]
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "service_unavailable" and "shutting down" in error["message"], error
    (r,) = whole
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"], r.text
    log = server.log()
    assert f"drain ended after {DRAIN_S}s (drain_timeout_s): 2 request(s) still running" in log, log[-3000:]
    assert "Traceback" not in log and "Cancel" not in log, log[-3000:]
    assert f"replica 0 of {model_path.stem} llamafleet.fleet.worker: context and model freed; exiting" in log
