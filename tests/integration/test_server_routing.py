"""Routing on a real 2-replica server: work spreads over both replicas, answers agree, disconnects abort."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import FleetServer

HEADER = "x-llamafleet-replicas"
COUNTING = "1, 2, 3, 4, 5,"  # greedy continues counting: long answers without an early end


def _generated(fleet: FleetServer) -> list[int]:
    return [r["generated_tokens"] for r in fleet.ready()[1]["replicas"]]


def _wait_idle(fleet: FleetServer, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while any(r["outstanding"] for r in fleet.ready()[1]["replicas"]):
        assert time.monotonic() < deadline, "sequences still outstanding"
        time.sleep(0.05)


def test_concurrent_load_reaches_both_replicas_with_identical_greedy_answers(fleet: FleetServer) -> None:
    client, model = fleet.client(), fleet.model()
    before = _generated(fleet)

    def ask(_: int) -> tuple[int, str]:
        raw = client.completions.with_raw_response.create(model=model, prompt="The three primary colors are",
                                                          max_tokens=12, temperature=0)
        return int(raw.headers[HEADER]), raw.parse().choices[0].text

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert {replica for replica, _ in answers} == {0, 1}
    assert len({text for _, text in answers}) == 1, answers
    after = _generated(fleet)
    assert all(after[i] - before[i] >= 12 for i in (0, 1))


def test_n_choices_fan_out_and_agree_when_greedy(fleet: FleetServer) -> None:
    client, model = fleet.client(), fleet.model()
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=8, temperature=0, n=4)
    assert sorted(raw.headers[HEADER].split(",")) == ["0", "0", "1", "1"]
    texts = [c.message.content for c in raw.parse().choices]
    assert len(set(texts)) == 1 and texts[0]


@pytest.mark.parametrize("stream", [True, False])
def test_client_that_leaves_aborts_its_sequence(fleet: FleetServer, stream: bool) -> None:
    max_tokens = 400  # far more than is generated before the abort lands
    body = {"model": fleet.model(), "prompt": COUNTING, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    before = _generated(fleet)
    if stream:
        with httpx.stream("POST", f"{fleet.url}/v1/completions", json=body, timeout=60) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen == 3:
                    break  # leave mid-stream
    else:
        payload = json.dumps(body).encode()
        host, port = fleet.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            deadline = time.monotonic() + 60
            while not any(r["outstanding"] for r in fleet.ready()[1]["replicas"]):
                assert time.monotonic() < deadline, "the request never started"
                time.sleep(0.02)
        # the connection is closed: the server notices within a poll and aborts
    _wait_idle(fleet)  # the sequence was released: cancelled on its replica
    assert sum(_generated(fleet)) - sum(before) < max_tokens
