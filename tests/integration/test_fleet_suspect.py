"""A frozen replica is *suspect* within seconds, long before it is hung (real servers, real workers).

* Two replicas, one stopped with SIGSTOP while it streams: chats that arrive before its bound and were routed to it
  move to the other replica; once it is suspect every new chat goes to the other; none fails; its stream waits for
  it; on SIGCONT it rejoins and finishes the stream, and its slots come back (the moved sequences were aborted
  there, not run twice).
* A lone replica that freezes is suspect too, but its requests have nowhere to go: they wait for it, as before.
* A replica that is slow but alive (one long prefill step on one thread, far past the 2 s floor) is never suspected.

The heartbeat timeout (killing a replica that stays silent) is tested with suspicion on in test_fleet_heartbeat.py.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from scrape import metric, scrape
from stream_thread import HEADER, StreamThread

from conftest import FleetServer

FLOOR_S = 2.0  # suspect_after_s's default


def _chat(server: FleetServer, max_tokens: int = 4) -> tuple[httpx.Response, float]:
    body = {"model": server.model(), "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": max_tokens,
            "temperature": 0}
    t0 = time.monotonic()
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    return r, time.monotonic() - t0


def _wave(server: FleetServer, n: int) -> list[tuple[httpx.Response, float]]:
    """``n`` short chats at once; each answer with its latency."""
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: _chat(server), range(n)))


def _replicas(server: FleetServer) -> list[dict[str, Any]]:
    return list(server.ready()[1]["replicas"])


def _wait_for(what: Callable[[], bool], timeout: float, why: str) -> float:
    """Poll ``what`` until true; the monotonic time it became so."""
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.05)
    return time.monotonic()


def _idle(server: FleetServer) -> bool:
    return all(r["outstanding"] == 0 and r["slots_busy"] == 0 for r in _replicas(server))


@pytest.fixture
def two_replicas(launch_fleet: Callable[[list[str]], FleetServer], model_path: Path,
                 tmp_path: Path) -> Iterator[FleetServer]:
    config = tmp_path / "fleet.yaml"
    config.write_text("heartbeat_timeout_s: 120\n")  # far: this test is about what comes before a hang
    server = launch_fleet(["--config", str(config), "--model", str(model_path), "--replicas", "2", "--parallel", "2",
                           "--ctx", "512", "--threads", "1"])
    server.wait_all_ready()
    yield server
    server.stop()


def test_a_frozen_replica_gets_no_new_work_what_waited_moves_and_it_rejoins(two_replicas: FleetServer) -> None:
    server = two_replicas
    baseline = _wave(server, 8)  # how long 8 short chats take on this (shared) machine, both replicas healthy
    assert [r.status_code for r, _ in baseline] == [200] * 8
    base_s = max(t for _, t in baseline)

    stream = StreamThread(server.url, server.model())
    stream.start()
    assert stream.started.wait(120) and stream.status == 200, stream.status
    victim = int(stream.replica)
    other = 1 - victim
    pid = _replicas(server)[victim]["pid"]
    os.kill(pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        early = _wave(server, 6)  # before the bound: some are routed to the frozen replica, then move
        suspected = _wait_for(lambda: _replicas(server)[victim]["suspect"], 30, "the frozen replica not suspected")
        late = _wave(server, 8)  # the goal: 8 of 8 answered by the healthy replica, none failing
        state = server.ready()
    finally:
        os.kill(pid, signal.SIGCONT)
    found = re.search(rf"replica {victim + 1}/2 \(CPU\): suspect: it sent nothing for ([\d.]+)s, past its bound of "
                      r"([\d.]+)s", server.log())
    assert found, server.log()[-3000:]
    bound = float(found.group(2))
    assert bound >= FLOOR_S
    print(f"\nbaseline 8 chats max {base_s:.2f}s; bound {bound:.2f}s, suspected {suspected - frozen_at:.2f}s after "
          f"the freeze; early wave max {max(t for _, t in early):.2f}s; late wave max {max(t for _, t in late):.2f}s")

    assert [r.status_code for r, _ in early + late] == [200] * 14, [r.text for r, _ in early + late]
    text = scrape(server.url)
    assert metric(text, "llamafleet_sequences_moved_total") >= 1  # some early ones waited on it, and moved
    assert all(r.headers[HEADER] == str(other) for r, _ in early + late)  # all answered by the healthy replica
    # none waited for the frozen replica longer than its bound (plus a check tick and the queue on one replica)
    assert max(t for _, t in early) <= bound + 0.5 + 2 * base_s + 1.0
    assert max(t for _, t in late) <= 2 * base_s + 1.0
    assert state[0] == 200 and state[1]["status"] == "degraded"

    _wait_for(lambda: not _replicas(server)[victim]["suspect"], 30, "the thawed replica did not rejoin")
    stream.join(120)
    assert stream.status == 200 and stream.finish == "length" and stream.replica == str(victim)  # left alone
    _wait_for(lambda: _idle(server), 60, "slots or sequences left behind")  # the moved ones were aborted there
    text = scrape(server.url)
    assert metric(text, "llamafleet_replica_suspect_total", replica=str(victim)) == 1
    assert metric(text, "llamafleet_replica_suspect_total", replica=str(other)) == 0
    assert metric(text, "llamafleet_replica_hangs_total", replica=str(victim)) == 0
    assert _replicas(server)[victim]["pid"] == pid and server.ready()[1]["status"] == "ready"
    rejoined = [_chat(server)[0].headers[HEADER] for _ in range(6)]  # both in rotation again
    assert str(victim) in rejoined, rejoined


@pytest.fixture(scope="module")
def lone_replica(launch_fleet: Callable[[list[str]], FleetServer], model_path: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> FleetServer:
    config = tmp_path_factory.mktemp("lone") / "fleet.yaml"
    config.write_text("heartbeat_timeout_s: 120\nprefill_tokens: 2048\n")  # a long prompt prefills in one step
    server = launch_fleet(["--config", str(config), "--model", str(model_path), "--replicas", "1", "--parallel", "1",
                           "--ctx", "2048", "--batch", "2048", "--threads", "1"])
    server.wait_ready()
    return server


def test_a_lone_frozen_replica_keeps_its_requests_until_it_wakes(lone_replica: FleetServer) -> None:
    server = lone_replica
    pid = _replicas(server)[0]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(2) as pool:
            pending = [pool.submit(_chat, server) for _ in range(2)]
            _wait_for(lambda: _replicas(server)[0]["suspect"], 30, "the frozen replica was not suspected")
            time.sleep(1.0)
            assert not any(p.done() for p in pending)  # nowhere to move them: they wait, they do not fail
            os.kill(pid, signal.SIGCONT)
            answers = [p.result(timeout=120)[0] for p in pending]
    finally:
        os.kill(pid, signal.SIGCONT)
    assert [a.status_code for a in answers] == [200, 200]
    text = scrape(server.url)
    assert metric(text, "llamafleet_sequences_moved_total") == 0
    assert metric(text, "llamafleet_replica_suspect_total", replica="0") == 1
    _wait_for(lambda: not _replicas(server)[0]["suspect"], 30, "the thawed replica did not rejoin")


def _prefill(server: FleetServer, word: str, words: int) -> tuple[int, float]:
    """One completion of ``word`` said ``words`` times and one token: its prompt tokens, and how long it took."""
    body = {"model": server.model(), "prompt": f"{word} " * words, "max_tokens": 1, "temperature": 0}
    t0 = time.monotonic()
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=600)
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens"]), took


def test_a_slow_but_alive_replica_is_never_suspected(lone_replica: FleetServer) -> None:
    server = lone_replica
    suspected = metric(scrape(server.url), "llamafleet_replica_suspect_total", replica="0")
    logged = server.log().count("suspect: it sent nothing")  # (the test before froze it once)
    # a prompt this machine prefills in about 4 floors (the longer the prompt, the slower each token: a little more);
    # another word than the probe's, so that no prefix of it is cached
    tokens, took = _prefill(server, "world", 200)
    tokens, took = _prefill(server, "hello", max(200, min(1900, int(4 * FLOOR_S * tokens / took))))
    print(f"\none prefill step of {tokens} tokens on one thread: {took:.1f}s")
    assert took > 2 * FLOOR_S  # one step far longer than the floor: its engine loop was silent that long
    assert metric(scrape(server.url), "llamafleet_replica_suspect_total", replica="0") == suspected
    assert server.log().count("suspect: it sent nothing") == logged
