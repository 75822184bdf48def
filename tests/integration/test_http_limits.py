"""What one connection may cost a real server (API keys on): oversized heads get 431 before they are buffered, heads
and bodies that trickle in get 408, a client that reads nothing of its answer is disconnected, client text that no
UTF-8 body can carry is answered with a 4xx, and ``/ready`` shows its details only to callers with a key.

Every HTTP exchange here is raw sockets or httpx against a ``llamafleet serve`` the module starts.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from scrape import metric

from conftest import FleetServer

KEY = "sk-limits"
AUTH = {"authorization": f"Bearer {KEY}"}
TIMEOUT_S = 2.0  # header_timeout_s, body_timeout_s and write_timeout_s of the module's server


@pytest.fixture(scope="module")
def guarded(launch_fleet: Callable[[list[str]], FleetServer], model_path: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetServer]:
    config = tmp_path_factory.mktemp("limits") / "fleet.yaml"
    config.write_text(f"header_timeout_s: {TIMEOUT_S}\nbody_timeout_s: {TIMEOUT_S}\nwrite_timeout_s: {TIMEOUT_S}\n",
                      encoding="utf-8")
    mp = pytest.MonkeyPatch()
    mp.setenv("LLAMAFLEET_API_KEYS", KEY)
    try:
        server = launch_fleet(["--config", str(config), "--model", str(model_path), "--replicas", "1", "--parallel",
                               "2", "--ctx", "256", "--threads", "1"])
    finally:
        mp.undo()
    server.wait_ready()
    yield server


def address(server: FleetServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def connect(server: FleetServer, timeout: float = 30.0) -> socket.socket:
    return socket.create_connection(address(server), timeout=timeout)


def route_count(server: FleetServer, route: str) -> float:
    """Answers counted under ``route``, every method and status."""
    text = httpx.get(f"{server.url}/metrics", headers=AUTH).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(f'llamafleet_http_requests_total{{route="{route}"'))


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (a reset after its answer counts as the close)."""
    out = b""
    try:
        while chunk := sock.recv(1 << 20):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def status_and_json(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def peak_rss_bytes(pid: int) -> int:
    """The process's largest resident size so far (a buffered head is freed after its answer: its peak stays)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def get(path: str, headers: bytes = b"") -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + KEY.encode() + b"\r\n" + \
        headers + b"\r\n"


def test_an_oversized_head_gets_431_before_it_is_buffered(guarded: FleetServer) -> None:
    before = peak_rss_bytes(guarded.proc.pid)
    for _ in range(4):  # 64 MB of headers in all
        with connect(guarded) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n")
            line = b"x-filler: " + b"a" * (1 << 16) + b"\r\n"
            try:
                for _ in range(256):  # 16 MB, each line past the limit alone
                    sock.sendall(line)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server stopped reading after its answer
            status, body = status_and_json(read_all(sock))
        assert status == 431 and "max_header_bytes" in body["error"]["message"], body
    grown = peak_rss_bytes(guarded.proc.pid) - before
    assert grown < 8 << 20, f"the server's peak memory grew by {grown >> 20} MiB while refusing 4 heads of 16 MB"
    # large but legal heads still pass, the key checked as usual
    with connect(guarded) as sock:
        sock.sendall(get("/v1/models", b"x-filler: " + b"b" * 16_000 + b"\r\nconnection: close\r\n"))
        status, body = status_and_json(read_all(sock))
    assert status == 200 and body["data"], body


def test_pipelined_requests_are_not_mistaken_for_one_big_head(guarded: FleetServer) -> None:
    n = 2000  # about 140 KB of heads in one send, over twice max_header_bytes
    with connect(guarded) as sock:
        sock.sendall(get("/health") * (n - 1) + get("/health", b"connection: close\r\n"))
        answers = read_all(sock)
    assert answers.count(b"HTTP/1.1 200 OK") == n


def test_a_head_that_trickles_in_gets_408(guarded: FleetServer) -> None:
    t0 = time.monotonic()
    with connect(guarded) as sock:
        sock.settimeout(0.5)
        answer = b""
        for byte in get("/v1/models"):  # one byte every half second: the head would take 35 s
            sock.sendall(bytes([byte]))
            try:
                answer = sock.recv(4096)
            except TimeoutError:
                continue
            break
        sock.settimeout(10)
        answer += read_all(sock)
    status, body = status_and_json(answer)
    assert status == 408 and "header_timeout_s" in body["error"]["message"], body
    assert TIMEOUT_S <= time.monotonic() - t0 < TIMEOUT_S + 3
    t0 = time.monotonic()
    with connect(guarded) as sock:  # a connection that never says anything is closed, silently
        assert read_all(sock) == b""
    assert TIMEOUT_S <= time.monotonic() - t0 < TIMEOUT_S + 3


def test_a_body_that_never_arrives_in_full_gets_408_and_is_never_run(guarded: FleetServer) -> None:
    model = guarded.model()
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4}).encode()
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + KEY.encode() +
            b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (len(body) + 100))
    routed = route_count(guarded, "/v1/completions")
    t0 = time.monotonic()
    with connect(guarded) as sock:
        sock.sendall(head + body)  # a whole JSON request, but 100 bytes short of what the head announced
        status, error = status_and_json(read_all(sock))
    assert status == 408 and "body_timeout_s" in error["error"]["message"], error
    assert TIMEOUT_S <= time.monotonic() - t0 < TIMEOUT_S + 3
    m = httpx.get(f"{guarded.url}/metrics", headers=AUTH).text
    assert metric(m, "llamafleet_http_requests_total", route="other", method="POST", status="408") >= 1
    assert route_count(guarded, "/v1/completions") == routed  # the half-received request never reached its route


def test_a_client_that_reads_nothing_is_disconnected(guarded: FleetServer) -> None:
    n = 2000  # about 25 MB of answers (/metrics), far more than the socket buffers hold
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(address(guarded))
        sock.sendall(get("/metrics") * n)
        # read nothing: the server's buffers fill, its writes stall, and after write_timeout_s it gives up
        deadline = time.monotonic() + 60
        while "it read nothing of its answer" not in guarded.log():
            assert time.monotonic() < deadline, "the server never gave up on the client that reads nothing"
            time.sleep(0.1)
        sock.settimeout(10)
        answers = read_all(sock)
    got = answers.count(b"HTTP/1.1 200 OK")
    assert 0 < got < n, f"{got} answers: the server waited for the client instead of closing the connection"
    log = guarded.log()
    assert "it read nothing of its answer for 2s (write_timeout_s)" in log
    assert "Traceback" not in log  # the pipelined requests behind the stalled one learn that the client left
    assert httpx.get(f"{guarded.url}/v1/models", headers=AUTH).status_code == 200  # the server still serves


def _requests(model: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A request for every field whose text reaches an error message, or the model, with a lone surrogate in it."""
    bad = "\ud800"
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    text = {"model": model, "prompt": "hi", "max_tokens": 2}
    for stream in (False, True):
        yield "/v1/chat/completions", {**chat, "stream": stream, "model": bad}
        yield "/v1/completions", {**text, "stream": stream, "model": f"x{bad}y"}
    yield "/v1/chat/completions", {**chat, "messages": [{"role": bad, "content": "hi"}]}
    yield "/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": bad}]}
    yield "/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": [{"type": "text", "text": bad}]}]}
    yield "/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": [{"type": bad, "text": "x"}]}]}
    yield "/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": "hi", bad: 1}]}
    yield "/v1/chat/completions", {**chat, "stop": bad}
    yield "/v1/chat/completions", {**chat, "stop": ["ok", bad]}
    yield "/v1/chat/completions", {**chat, bad: 1}
    yield "/v1/chat/completions", {**chat, "stream_options": {bad: True}}
    yield "/v1/chat/completions", {**chat, "n": bad}
    yield "/v1/completions", {**text, "prompt": bad}
    yield "/v1/completions", {**text, "prompt": ["ok", f"a{bad}"], "stream": True}
    yield "/v1/completions", {**text, "stop": bad}
    yield "/v1/completions", {**text, f"{bad}\n\udfff": "x"}
    yield "/api/generate", {"prompt": bad}
    yield "/api/generate", {"prompt": "hi", "stop": [bad]}
    yield "/api/generate", {"prompt": "hi", "max_tokens": bad}
    yield "/api/generate", {"prompt": "hi", bad: 1}


def test_lone_surrogates_in_client_text_get_4xx_json(guarded: FleetServer) -> None:
    model = guarded.model()
    with httpx.Client(base_url=guarded.url, headers=AUTH, timeout=60) as client:
        sent = 0
        for path, body in _requests(model):
            # json.dumps escapes the surrogate as \ud800, which is valid JSON
            r = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
            sent += 1
            assert r.status_code in (400, 404), (path, body, r.status_code, r.text[:300])
            message = r.json()["error"]["message"]
            assert isinstance(message, str) and "\ud800" not in message
        r = client.get("/v1/models/%ED%A0%80")  # the path's bytes of a surrogate
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        m = client.get("/metrics").text
    errors = [line for line in m.splitlines() if line.startswith("llamafleet_http_requests_total") and
              'status="5' in line and 'route="/ready"' not in line]  # /ready says 503 while loading
    assert sent >= 20 and not errors, errors


def test_ready_shows_details_only_to_callers_with_a_key(guarded: FleetServer) -> None:
    for headers in ({}, {"authorization": "Bearer wrong"}):
        r = httpx.get(f"{guarded.url}/ready", headers=headers)
        assert r.status_code == 200 and r.json()["status"] == "ready"
        (replica,) = r.json()["replicas"]
        assert set(replica) == {"index", "where", "status", "suspect", "restarts", "slots", "slots_busy"}, replica
    (replica,) = httpx.get(f"{guarded.url}/ready", headers=AUTH).json()["replicas"]
    assert replica["pid"] > 0 and "last_error" in replica and "outstanding" in replica
