"""Tenants against a real server (the demo model): usage counted from real tokens per key name, a token limit
crossed by real use, reloads of the keys file, and a burst of 10,000 requests from one key over its rate."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from conftest import FleetServer

KEYS = """\
keys:
  - {name: chat, key: k-chat, scopes: [inference], priority: interactive}
  - {name: small, key: k-small, scopes: [inference], limits: {tokens_per_minute: 30}}
  - {name: burst, key: k-burst, scopes: [inference], priority: batch, limits: {requests_per_minute: 60}}
  - {name: ops, key: k-ops, scopes: [admin, metrics]}
"""


@pytest.fixture(scope="module")
def keyed(launch_fleet: Callable[[list[str]], FleetServer], model_path: Path,
          tmp_path_factory: pytest.TempPathFactory) -> tuple[FleetServer, Path]:
    keys = tmp_path_factory.mktemp("tenants") / "keys.yaml"
    keys.write_text(KEYS, encoding="utf-8")
    server = launch_fleet(["--model", str(model_path), "--parallel", "2", "--ctx", "512", "--threads", "1",
                           "--api-keys-file", str(keys)])
    server.wait_ready()
    return server, keys


def _client(server: FleetServer, key: str) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120.0)


def _get(server: FleetServer, path: str, key: str = "k-ops") -> httpx.Response:
    return httpx.get(f"{server.url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_usage_counts_each_keys_real_tokens_by_name(keyed: tuple[FleetServer, Path]) -> None:
    server, _ = keyed
    with _client(server, "k-chat") as client:
        answer = client.chat.completions.create(model=server.model(), max_tokens=8, temperature=0,
                                                messages=[{"role": "user", "content": "Say hello."}])
    assert answer.usage is not None
    today = time.strftime("%Y-%m-%d", time.gmtime())
    (row,) = _get(server, f"/v1/usage?key=chat&day={today}").json()["data"]
    assert row["requests"] == 1 and row["prompt_tokens"] == answer.usage.prompt_tokens
    assert row["completion_tokens"] == answer.usage.completion_tokens
    assert _get(server, "/v1/usage", "k-chat").status_code == 403  # usage is for admin keys
    assert _get(server, "/v1/usage?key=nobody").status_code == 404
    metrics = _get(server, "/metrics").text
    assert f'llamafleet_key_completion_tokens_total{{key="chat"}} {answer.usage.completion_tokens}' in metrics
    assert "k-chat" not in metrics and "k-chat" not in server.log()
    own = _get(server, "/v1/status", "k-chat").json()["keys"]
    assert [r["key"] for r in own] == ["chat"]  # a key without the admin scope sees only its own


def test_a_token_limit_is_crossed_by_real_use_then_refused(keyed: tuple[FleetServer, Path]) -> None:
    server, _ = keyed
    with _client(server, "k-small") as client:
        first = client.completions.create(model=server.model(), prompt="Count: 1, 2, 3,", max_tokens=40,
                                          temperature=0, extra_body={"ignore_eos": True})
        assert first.usage is not None and first.usage.total_tokens > 30  # admitted with tokens left: it finishes
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model=server.model(), prompt="again", max_tokens=4)
    body = e.value.body
    assert isinstance(body, dict) and body["param"] == "tokens_per_minute" and body["code"] == "rate_limit_exceeded"
    assert int(e.value.response.headers["retry-after"]) >= 1


def test_the_keys_file_reloads_when_it_changes_and_a_bad_one_keeps_the_old_keys(
        keyed: tuple[FleetServer, Path]) -> None:
    server, keys = keyed

    def status_of(key: str) -> int:
        return _get(server, "/v1/models", key).status_code

    def write(text: str) -> None:  # whole, as an editor saves it: never half a file
        keys.with_suffix(".new").write_text(text, encoding="utf-8")
        keys.with_suffix(".new").replace(keys)

    def until(check: Callable[[], bool]) -> bool:
        for _ in range(100):
            if check():
                return True
            time.sleep(0.1)
        return False

    write(KEYS + "  - {name: late, key: k-late}\n")
    assert until(lambda: status_of("k-late") == 200)  # the file changed: picked up without a restart
    write(KEYS.replace("scopes: [admin, metrics]", "scopes: [admn]"))
    assert until(lambda: "keys file was not reloaded" in server.log())
    assert status_of("k-late") == 200 and status_of("k-chat") == 200  # the old keys stay in force
    assert "did you mean 'admin'" in server.log()
    write(KEYS)
    assert until(lambda: status_of("k-late") == 401)


async def _burst(url: str, n: int, connections: int = 16) -> Counter[int]:
    """``n`` POST /tokenize requests with the burst key, pipelined over keep-alive ``connections`` (raw HTTP/1.1:
    the client's own cost stays small beside the server's); the statuses of the answers."""
    host, port = url.removeprefix("http://").split(":")
    body = b'{"content": "hi"}'
    one = (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k-burst\r\nContent-Type: application/json"
           b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    statuses: Counter[int] = Counter()

    async def connection(count: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(one * count)
        await writer.drain()
        for _ in range(count):
            head = await reader.readuntil(b"\r\n\r\n")
            statuses[int(head.split(b" ", 2)[1])] += 1
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)
        writer.close()

    await asyncio.gather(*(connection(n // connections + (i < n % connections)) for i in range(connections)))
    return statuses


def test_a_burst_of_10000_over_the_rate_gets_429s_while_other_keys_are_served(
        keyed: tuple[FleetServer, Path]) -> None:
    server, _ = keyed
    model = server.model()

    def ask(client: OpenAI) -> float:
        t0 = time.perf_counter()
        r = client.completions.create(model=model, prompt="The sky is", max_tokens=4, temperature=0)
        assert r.choices[0].text is not None
        return time.perf_counter() - t0

    with _client(server, "k-chat") as client:
        before = [ask(client) for _ in range(3)]
        t0 = time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            task = pool.submit(asyncio.run, _burst(server.url, 10_000))
            during = []
            while not task.done():
                during.append(ask(client))
            statuses = task.result()
        elapsed = time.monotonic() - t0
    # 60 at once, then one a second: the bucket refills while the burst runs
    assert statuses[200] <= 61 + elapsed and statuses[429] == 10_000 - statuses[200]
    assert len(during) >= 1  # the other key was served, every time, while the burst ran
    metrics = _get(server, "/metrics").text
    assert f'llamafleet_key_refused_total{{key="burst",limit="requests_per_minute"}} {statuses[429]}' in metrics
    print(f"burst of 10,000 in {elapsed:.1f}s: {dict(statuses)}; the other key's latency: before "
          f"{statistics.median(before):.3f}s, during the burst {statistics.median(during):.3f}s "
          f"({len(during)} requests)")
