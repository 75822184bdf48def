"""Reliability on real servers: a worker killed under load, a client leaving mid-stream, a burst past the queues.

The kill and the disconnect use the shared 2-replica server (replica 0 is the victim here; test_server_faults
kills replica 1). The burst gets a server of its own with a tiny queue.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from scrape import metric, scrape

from conftest import FleetServer

COUNTING = "1, 2, 3, 4, 5,"


def metrics(fleet: FleetServer) -> str:
    return scrape(fleet.url)


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_killed_worker_fails_its_requests_with_503_others_succeed_and_it_restarts(fleet: FleetServer) -> None:
    model = fleet.model()
    _, before = fleet.ready()
    victim = before["replicas"][0]["pid"]
    restarts = metric(metrics(fleet), "llamafleet_replica_restarts_total", replica="0")
    lost_before = metric(metrics(fleet), "llamafleet_sequences_total", outcome="lost")
    ended: list[tuple[int, str]] = []  # (status, message) in the order requests ended
    lock = threading.Lock()

    def one() -> None:
        r = httpx.post(f"{fleet.url}/v1/completions", timeout=120,
                       json={"model": model, "prompt": COUNTING, "max_tokens": 96, "temperature": 0})
        with lock:
            ended.append((r.status_code, r.text))

    with ThreadPoolExecutor(8) as pool:
        for _ in range(8):
            pool.submit(one)
        wait_for("8 requests in the slots", lambda: all(
            r["slots_busy"] == 4 for r in fleet.ready()[1]["replicas"]))
        os.kill(victim, signal.SIGKILL)
        saw_degraded = False

        def restarted() -> bool:
            nonlocal saw_degraded
            status, body = fleet.ready()
            # the other replica still serves: 200, with the dead one reported
            saw_degraded |= status == 200 and body["status"] == "degraded" and body["replicas"][0]["status"] != "ready"
            return body["status"] == "ready" and body["replicas"][0]["pid"] != victim

        wait_for("the replica to come back", restarted, timeout=120)
    assert saw_degraded, "/ready never reported the dead replica"
    statuses = [s for s, _ in ended]
    assert sorted(statuses) == [200] * 4 + [503] * 4, ended
    assert statuses[:4] == [503] * 4, "the killed replica's requests did not fail before the others finished"
    assert all("replica 0" in text and "retry" in text for s, text in ended if s == 503)
    after = metrics(fleet)
    assert metric(after, "llamafleet_replica_restarts_total", replica="0") == restarts + 1
    assert metric(after, "llamafleet_sequences_total", outcome="lost") == lost_before + 4
    assert metric(after, "llamafleet_replica_up", replica="0", where="CPU") == 1
    r = httpx.post(f"{fleet.url}/v1/completions", timeout=60, json={"model": model, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200


def test_client_leaving_mid_stream_frees_its_slot(fleet: FleetServer) -> None:
    model = fleet.model()
    m0 = metrics(fleet)
    received = 0
    with httpx.stream("POST", f"{fleet.url}/v1/completions", timeout=60,
                      json={"model": model, "prompt": COUNTING, "max_tokens": 400, "temperature": 0,
                            "ignore_eos": True, "stream": True}) as r:
        for line in r.iter_lines():
            received += line.startswith("data: ")
            if received == 3:
                break  # leaving the block closes the connection
    wait_for("the slot to be freed", lambda: metric(metrics(fleet), "llamafleet_sequences_total",
                                                    outcome="cancelled") == metric(m0, "llamafleet_sequences_total",
                                                                                   outcome="cancelled") + 1)
    m1 = metrics(fleet)
    assert all(metric(m1, "llamafleet_replica_slots_busy", replica=str(i)) == 0 for i in (0, 1))
    assert all(metric(m1, "llamafleet_replica_outstanding", replica=str(i)) == 0 for i in (0, 1))
    generated = metric(m1, "llamafleet_generated_tokens_total") - metric(m0, "llamafleet_generated_tokens_total")
    print(f"\ndisconnect: client read {received} events, the sequence generated {generated:.0f} of 400 tokens")
    # one token per step: the abort reached the engine within a few steps of the client leaving (typically one)
    assert generated <= received + 8, "the sequence kept running after its client left"


def test_queue_full_burst_gets_429_with_retry_after_and_nothing_is_lost(
        launch_fleet: Callable[[list[str]], FleetServer], model_path: Path) -> None:
    server = launch_fleet(["--model", str(model_path), "--replicas", "1", "--parallel", "2", "--ctx", "128",
                           "--threads", "1", "--max-queue-per-replica", "2", "--max-queue", "2"])
    model = server.wait_ready()["model"]
    n = 12  # three times what the 2 slots and 2 queue places take
    answers: dict[int, list[str]] = {i: [] for i in range(n)}  # request -> the completion ids it got
    statuses: list[int] = []
    pending = list(range(n))
    with httpx.Client(base_url=server.url, timeout=60) as client, ThreadPoolExecutor(n) as pool:
        while pending:
            def send(i: int) -> tuple[int, httpx.Response]:
                return i, client.post("/v1/completions", json={"model": model, "prompt": f"{i}:", "max_tokens": 8,
                                                               "temperature": 0})
            results = list(pool.map(send, pending))
            pending = []
            for i, r in results:
                statuses.append(r.status_code)
                if r.status_code == 200:
                    answers[i].append(r.json()["id"])
                    continue
                assert r.status_code == 429, r.text
                assert r.json()["error"]["code"] == "rate_limit_exceeded"
                pending.append(i)
                retry_after = int(r.headers["retry-after"])
            if pending:
                time.sleep(retry_after)
    assert statuses.count(429) > 0 and statuses[:n].count(200) >= 4  # 2 slots + 2 queued took the first burst
    assert all(len(ids) == 1 for ids in answers.values())  # every request answered exactly once
    assert len({ids[0] for ids in answers.values()}) == n
    m = metrics(server)
    route = {"route": "/v1/completions", "method": "POST"}
    assert metric(m, "llamafleet_http_requests_total", **route, status="200") == n
    assert metric(m, "llamafleet_http_requests_total", **route, status="429") == statuses.count(429)
    assert metric(m, "llamafleet_requests_refused_total", reason="queue_full") == statuses.count(429)
    finished = sum(metric(m, "llamafleet_sequences_total", outcome=o) for o in ("length", "stop"))
    assert finished == n and metric(m, "llamafleet_queue_depth") == 0
    assert server.stop(signal.SIGTERM) == 0  # graceful: workers free their engines and exit, the server exits 0
    freed = f"replica 0 of {model_path.stem} llamafleet.fleet.worker: context and model freed; exiting"
    assert freed in server.log()


def test_request_timeout_gives_504_and_frees_the_slot(launch_fleet: Callable[[list[str]], FleetServer],
                                                      model_path: Path) -> None:
    server = launch_fleet(["--model", str(model_path), "--replicas", "1", "--parallel", "2", "--ctx", "1024",
                           "--threads", "1", "--request-timeout", "0.5"])
    model = server.wait_ready()["model"]
    long = {"model": model, "prompt": COUNTING, "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
    r = httpx.post(f"{server.url}/v1/completions", json=long, timeout=60)
    assert r.status_code == 504 and "request_timeout_s" in r.json()["error"]["message"], r.text
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**long, "stream": True}, timeout=60) as s:
        assert s.status_code == 200
        events = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert "request_timeout_s" in events[-2] and '"error"' in events[-2] and events[-1] == "data: [DONE]"
    wait_for("both sequences to be aborted", lambda: metric(
        metrics(server), "llamafleet_sequences_total", outcome="timeout") == 2)
    m = metrics(server)
    assert metric(m, "llamafleet_sequences_total", outcome="cancelled") == 0  # each sequence is counted once
    assert metric(m, "llamafleet_replica_slots_busy", replica="0") == 0


def test_a_second_stop_signal_ends_running_streams_at_once(launch_fleet: Callable[[list[str]], FleetServer],
                                                            model_path: Path) -> None:
    """First SIGINT: drain. Second: running requests end now with a 503 error event, no traceback, exit 0."""
    server = launch_fleet(["--model", str(model_path), "--replicas", "1", "--parallel", "2", "--ctx", "2048",
                           "--threads", "1"])
    model = server.wait_ready()["model"]
    events: list[str] = []
    started = threading.Event()

    def stream() -> None:
        body = {"model": model, "prompt": COUNTING, "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as s:
            for line in s.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(30), "the stream never started"
    server.proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    t0 = time.monotonic()
    assert server.stop(signal.SIGINT, timeout=30) == 0
    assert time.monotonic() - t0 < 8, "the second signal did not cut the drain short"
    reader.join(10)
    assert "second stop signal" in events[-2] and '"service_unavailable"' in events[-2], events[-2:]
    assert events[-1] == "data: [DONE]"
    log = server.log()
    # said once, at the first signal: what happens, and what the second one does (not uvicorn's "force quit")
    assert log.count("SIGINT: stopping; 1 running request(s) get up to 10s (drain_timeout_s) to finish; a second "
                     "Ctrl-C or SIGTERM ends them now with a 503") == 1
    assert "CTRL+C" not in log
    assert "SIGINT again: ending 1 running sequence(s) now" in log and "Traceback" not in log
    assert f"replica 0 of {model_path.stem} llamafleet.fleet.worker: context and model freed; exiting" in log
