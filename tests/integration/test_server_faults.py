"""Faults on a real 2-replica server: malformed requests get 4xx and change nothing; a worker killed with SIGKILL
fails only its own requests, at once, and comes back while the other replica keeps serving."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from conftest import FleetServer

HEADER = "x-llamafleet-replicas"
COUNTING = "1, 2, 3, 4, 5,"


def _post(fleet: FleetServer, path: str, **kw: Any) -> httpx.Response:
    return httpx.post(f"{fleet.url}{path}", timeout=60, **kw)


def _error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return str(err["message"])


def test_malformed_requests_get_4xx_and_the_server_keeps_serving(fleet: FleetServer) -> None:
    model = fleet.model()
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    bad_json = _post(fleet, "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert "not valid JSON" in _error(bad_json, 400)
    assert "temperature" in _error(_post(fleet, "/v1/chat/completions", json={**chat, "temperature": "warm"}), 400)
    assert "messages" in _error(_post(fleet, "/v1/chat/completions", json={"model": model}), 400)
    assert "less than or equal to 1" in _error(_post(fleet, "/v1/chat/completions", json={**chat, "top_p": 5}), 400)
    assert "model_not_found" in _post(fleet, "/v1/chat/completions", json={**chat, "model": "gpt-4o"}).text
    assert "no route" in _error(httpx.get(f"{fleet.url}/v1/engines"), 404)

    long_prompt = "hello " * 600  # about 600 tokens; the context is 512
    for stream in (False, True):
        msg = _error(_post(fleet, "/v1/completions", json={"model": model, "prompt": long_prompt, "stream": stream}),
                     400)
        assert "maximum context length is 512 tokens" in msg and "601 in your prompt" in msg
    msg = _error(_post(fleet, "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 5000}), 400)
    assert "max_tokens (5000)" in msg and "(512)" in msg
    # one bad prompt in a batch fails the request; the good one is cancelled, not leaked
    msg = _error(_post(fleet, "/v1/completions", json={"model": model, "prompt": [COUNTING, long_prompt],
                                                       "max_tokens": 100}), 400)
    assert "maximum context length is 512 tokens" in msg

    with pytest.raises(openai.BadRequestError) as e:
        fleet.client().chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], n=100)
    assert e.value.status_code == 400 and isinstance(e.value.body, dict) and e.value.body["param"] == "n"

    r = fleet.client().chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4, temperature=0)
    assert r.choices[0].message.content
    deadline = time.monotonic() + 60
    while any(x["outstanding"] for x in fleet.ready()[1]["replicas"]):
        assert time.monotonic() < deadline, "a rejected batch left sequences behind"
        time.sleep(0.05)


class _Stream(threading.Thread):
    """One streaming completion; records its replica, when its first chunk came, and how it ended."""

    order = 0
    lock = threading.Lock()

    def __init__(self, fleet: FleetServer, model: str, max_tokens: int = 64) -> None:
        super().__init__(daemon=True)
        self.fleet, self.model, self.max_tokens = fleet, model, max_tokens
        self.replica = -1
        self.started = threading.Event()
        self.error: Exception | None = None
        self.finish: str | None = None
        self.ended_as = -1  # position among all streams' ends

    def run(self) -> None:
        client = self.fleet.client()
        try:
            raw = client.completions.with_raw_response.create(model=self.model, prompt=COUNTING,
                                                              max_tokens=self.max_tokens, temperature=0, stream=True)
            self.replica = int(raw.headers[HEADER])
            for chunk in raw.parse():
                self.started.set()
                self.finish = chunk.choices[0].finish_reason or self.finish
        except openai.APIError as e:
            self.error = e
        finally:
            self.started.set()
            with _Stream.lock:
                self.ended_as, _Stream.order = _Stream.order, _Stream.order + 1


def test_sigkill_of_a_worker_fails_only_its_requests_and_it_comes_back(fleet: FleetServer) -> None:
    model = fleet.model()
    _, before = fleet.ready()
    with ThreadPoolExecutor(1) as pool:
        # a whole (non-streamed) request whose two choices run on both replicas: it fails as a whole, with 503
        whole = pool.submit(fleet.client().completions.create, model=model, prompt=COUNTING, max_tokens=64,
                            temperature=0, n=2)
        streams = [_Stream(fleet, model) for _ in range(6)]
        for s in streams:
            s.start()
        for s in streams:
            assert s.started.wait(120), "a stream never started"
        assert sum(r["outstanding"] for r in fleet.ready()[1]["replicas"]) == 8
        assert {s.replica for s in streams} == {0, 1}
        victim = before["replicas"][1]["pid"]
        os.kill(victim, signal.SIGKILL)
        for s in streams:
            s.join(180)
            assert not s.is_alive(), "a request hung after its worker died"
        error = whole.exception(180)
    assert isinstance(error, openai.APIStatusError) and error.status_code == 503, error
    assert "replica 1" in error.message and "retry" in error.message

    lost = [s for s in streams if s.replica == 1]
    kept = [s for s in streams if s.replica == 0]
    for s in lost:
        assert isinstance(s.error, openai.APIError) and "replica 1" in str(s.error) and "retry" in str(s.error)
    for s in kept:
        assert s.error is None and s.finish == "length"
    # the failed requests ended at once, before any request of the surviving replica finished
    assert max(s.ended_as for s in lost) < min(s.ended_as for s in kept)

    body = fleet.wait_all_ready(timeout=180)
    back = body["replicas"][1]
    assert back["restarts"] == 1 and back["pid"] != victim and back["status"] == "ready"
    assert body["replicas"][0]["pid"] == before["replicas"][0]["pid"]
    raw = fleet.client().chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0, n=2)
    assert sorted(raw.headers[HEADER].split(",")) == ["0", "1"] and all(c.message.content for c in raw.parse().choices)
