"""One streamed request to an OpenAI-compatible server, timed from the client's side: what every bench workload
sends and measures.

:class:`Target` is what all workloads share (server, model, answer length, endpoint, timeouts). :func:`send` posts
one streaming body over a keep-alive :class:`~llamafleet.bench.client.Connection` and records time to the first
content chunk, the arrival of every content chunk, the end of the stream, the answer's text, and the server's
``usage``: completion and prompt tokens, and ``prompt_tokens_details.cached_tokens`` (the prompt tokens the server
took from its prefix cache) where the server reports it (its lines read by :func:`llamafleet.openai_wire.
parse_sse_line`, as a remote member reads its upstream's). Requests are greedy (``temperature`` 0) and send
``"ignore_eos": true`` unless told not to, so answers run to ``max_tokens`` where the server honours it.
The workloads are :mod:`llamafleet.bench.loadgen` (a concurrency sweep) and :mod:`llamafleet.bench.multiturn`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from tqdm import tqdm

from llamafleet.bench.client import Connection, Origin, StreamClientError
from llamafleet.openai_wire import bearer, parse_sse_line, root_url

T = TypeVar("T")


class BenchError(RuntimeError):
    """The benchmark cannot run as asked (unreachable server, unknown model, a refused warm-up)."""


@dataclass(frozen=True)
class Target:
    """The server and what every request asks of it."""

    url: str
    model: str
    max_tokens: int = 128
    chat: bool = False
    api_key: str | None = None
    timeout: float = 600.0
    warmup: int = 1
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")

    @property
    def endpoint(self) -> str:
        return "/v1/chat/completions" if self.chat else "/v1/completions"

    def body(self) -> dict[str, Any]:
        """A streaming request body without its prompt (``prompt`` or ``messages`` is the workload's to add)."""
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "temperature": 0.0,
                                "stream": True, "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body

    def connection(self) -> Connection:
        return Connection(Origin.parse(root_url(self.url)), connect_timeout=min(self.timeout, 30.0))


@dataclass
class RequestResult:
    """One request as the client saw it. Times are seconds since the request was sent."""

    ok: bool = False
    error: str | None = None
    sent_at: float = 0.0  # time.perf_counter() when the request was sent (to line requests up on one clock)
    latency: float = 0.0  # until the stream ended
    chunk_times: list[float] = field(default_factory=list)  # arrival of every chunk that carried content
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # None: the server did not report it
    usage_reported: bool = False
    finish_reason: str | None = None
    text: str = ""  # the answer, as streamed


async def send(conn: Connection, target: Target, body: dict[str, Any]) -> RequestResult:
    """Send one streaming request and time it. Never raises for server or network failures: they become
    ``error``."""
    res = RequestResult()
    payload = json.dumps(body).encode()
    pieces: list[str] = []
    t0 = res.sent_at = time.perf_counter()
    done = False
    try:
        async with asyncio.timeout(target.timeout):
            resp = await conn.post(target.endpoint, payload, bearer(target.api_key))
            if resp.status != 200:
                detail = (await resp.read()).decode("utf-8", "replace").strip()
                res.error = f"HTTP {resp.status}: {detail[:300]}"
            else:
                async for line in resp.lines():  # read to the end, so that the connection can be reused
                    ev = None if done else parse_sse_line(line)
                    if ev is None:
                        continue
                    if ev.error is not None:
                        res.error = ev.error
                        break
                    if ev.done:
                        done = True
                        continue
                    if ev.text:
                        res.chunk_times.append(time.perf_counter() - t0)
                        pieces.append(ev.text)
                    if ev.completion_tokens is not None:
                        res.output_tokens, res.usage_reported = ev.completion_tokens, True
                        res.prompt_tokens, res.cached_tokens = ev.prompt_tokens, ev.cached_tokens
                    res.finish_reason = ev.finish_reason or res.finish_reason
    except StreamClientError as e:
        res.error = str(e)
    except TimeoutError:
        res.error = f"no complete answer within --timeout {target.timeout:g} s"
        await conn.close()
    res.latency = time.perf_counter() - t0
    if res.error is None and not done and res.finish_reason is None:
        res.error = "the stream ended without [DONE] or a finish_reason"
    if not res.usage_reported:
        res.output_tokens = len(res.chunk_times)
    res.text = "".join(pieces)
    res.ok = res.error is None
    return res


async def warm_up(target: Target, body: Callable[[int], dict[str, Any]]) -> None:
    """Send ``target.warmup`` untimed requests (``body(i)`` for the i-th); a failure stops the run with the
    server's answer."""
    conn = target.connection()
    try:
        for i in range(target.warmup):
            res = await send(conn, target, body(i))
            if not res.ok:
                hint = ("; this server refuses the extra field ignore_eos: run again with --no-ignore-eos"
                        if target.ignore_eos and "ignore_eos" in (res.error or "") else "")
                raise BenchError(f"the warm-up request to {target.url} failed: {res.error}{hint}")
    finally:
        await conn.close()


def counting(bar: tqdm[Any]) -> Callable[[RequestResult], None]:
    """A callback that advances ``bar`` by one request and shows the failures so far."""
    errors = 0

    def tick(res: RequestResult) -> None:
        nonlocal errors
        errors += not res.ok
        bar.update(1)
        if errors:
            bar.set_postfix(errors=errors)

    return tick


def run_blocking(main: Coroutine[Any, Any, T]) -> T:
    """Run a workload to its end, on uvloop where it is installed (a cheaper event loop leaves more of the
    client's one core for reading streams)."""
    try:
        import uvloop
        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def resolve_model(url: str, api_key: str | None, timeout: float = 30.0) -> str:
    """The first model the server lists at ``/v1/models``; raises :class:`BenchError` with the fix otherwise."""
    target = root_url(url) + "/v1/models"
    try:
        resp = httpx.get(target, headers=bearer(api_key), timeout=timeout)
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach {target} ({type(e).__name__}: {e}); start the server or fix --url") from None
    if resp.status_code != 200:
        raise BenchError(f"{target} answered HTTP {resp.status_code}; pass the model name with --model-name")
    try:
        data = resp.json().get("data") or []
        return str(data[0]["id"])
    except (ValueError, AttributeError, LookupError, TypeError):
        raise BenchError(f"{target} lists no models; pass the model name with --model-name") from None
