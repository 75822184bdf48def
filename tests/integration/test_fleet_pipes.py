"""Messages far bigger than a pipe's buffer, on a real 2-replica server: every one the API accepts reaches its worker
and comes back answered, while other clients' requests keep succeeding and no replica restarts.

The pipe between the API process and a worker holds a few tens of KB; a request's message to its worker holds the
prompt, the stop strings and the sampling parameters, so a body well under ``max_body_bytes`` (1 MiB) can be ten times
that. Such a message once failed with ``EAGAIN`` on the event loop's non-blocking socket, which was taken for the
worker's death: the replica was killed and everything running on it failed.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from conftest import FleetServer

COUNTING = "1, 2, 3, 4, 5,"


class _Bystanders:
    """Clients sending small chat requests one after another until stopped; records every answer's status."""

    def __init__(self, fleet: FleetServer, model: str, clients: int = 3) -> None:
        self.fleet, self.model = fleet, model
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> _Bystanders:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)

    def _run(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                "temperature": 0}
        while not self._stop.is_set():
            try:
                r = httpx.post(f"{self.fleet.url}/v1/chat/completions", json=body, timeout=60)
                self.statuses.append(r.status_code)
                if r.status_code != 200:
                    self.errors.append(r.text)
            except httpx.HTTPError as e:
                self.errors.append(repr(e))


def _post(fleet: FleetServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{fleet.url}/v1/completions", json=body, timeout=120)


def _replicas(fleet: FleetServer) -> list[tuple[int, int]]:
    """(pid, restarts) of every replica."""
    return [(r["pid"], r["restarts"]) for r in fleet.ready()[1]["replicas"]]


def test_messages_bigger_than_the_pipe_reach_the_worker_and_no_replica_dies(fleet: FleetServer) -> None:
    model = fleet.model()
    fleet.wait_ready()
    before = _replicas(fleet)
    stops = [f"{i}" + "x" * 60_000 for i in range(10)]  # 600 KB of stop strings: one message of about 600 KB
    with _Bystanders(fleet, model) as bystanders:
        time.sleep(0.5)
        for _ in range(3):  # the replica that takes it alternates: both see the big message
            r = _post(fleet, {"model": model, "prompt": COUNTING, "max_tokens": 8, "temperature": 0, "stop": stops})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["finish_reason"] == "length"

        big_prompt = "hello " * 100_000  # 600 KB, 100k tokens: tokenized by the worker and refused as too long
        r = _post(fleet, {"model": model, "prompt": big_prompt, "max_tokens": 4})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert "maximum context length is 512 tokens" in r.json()["error"]["message"]

        # 16 sequences of a 42 KB prompt: 8 messages of 42 KB to each replica at once
        r = _post(fleet, {"model": model, "prompt": "hello " * 7_000, "max_tokens": 4, "n": 16})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert "maximum context length is 512 tokens" in r.json()["error"]["message"]

        time.sleep(0.5)
    assert bystanders.statuses and not bystanders.errors, bystanders.errors[:3]
    assert _replicas(fleet) == before, "a replica was restarted"
