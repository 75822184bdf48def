"""Load generator for any OpenAI-compatible endpoint (llamafleet, llama-server, vLLM, Ollama).

For each concurrency level, that many workers send streaming requests back to back (``/v1/completions``, or
``/v1/chat/completions`` with ``chat``) until the level's request count or duration is used up. Every request
records, from the client's side: time to the first content chunk (TTFT), the arrival time of every content chunk
(inter-token latency), end-to-end latency, and its output token count, taken from the server's ``usage`` (asked for
with ``stream_options.include_usage``) or, where a server sends none, from the number of content chunks.

Requests are greedy (``temperature`` 0) and send ``"ignore_eos": true`` (unless told not to, for servers that refuse
unknown fields) so every answer runs to ``max_tokens`` where the server honours it (llamafleet, llama-server and
vLLM do); answers that still end early are counted, so runs stay comparable. Statistics and files are
:mod:`llamafleet.bench.report`'s job; this module only measures.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from llamafleet.bench.client import Connection, Origin, StreamClientError


class BenchError(RuntimeError):
    """The benchmark cannot run as asked (unreachable server, unknown model, unreadable prompt file)."""


@dataclass(frozen=True)
class BenchConfig:
    """What to send and how hard. ``requests`` (per level) and ``duration`` (seconds per level) exclude each other;
    with neither, each level sends ``4 x concurrency`` requests (at least 16)."""

    url: str
    model: str
    concurrency: tuple[int, ...] = (1, 8, 32)
    requests: int | None = None
    duration: float | None = None
    max_tokens: int = 128
    chat: bool = False
    api_key: str | None = None
    timeout: float = 600.0
    warmup: int = 1
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError("concurrency needs one or more positive levels, e.g. 1,8,32")
        if self.requests is not None and self.duration is not None:
            raise ValueError("give either requests (per level) or duration (seconds per level), not both")
        if self.requests is not None and self.requests < 1:
            raise ValueError("requests must be >= 1")
        if self.duration is not None and self.duration <= 0:
            raise ValueError("duration must be > 0 seconds")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")

    def requests_for(self, concurrency: int) -> int | None:
        """Requests to send at this level; ``None`` in duration mode."""
        if self.duration is not None:
            return None
        return self.requests if self.requests is not None else max(16, 4 * concurrency)


@dataclass(frozen=True)
class Prompt:
    """One prompt: plain text (sent as ``prompt``, or as one user message in chat mode) or chat messages."""

    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()


# Common English words that are one token each (after a space) in the LLaMA-2 (SentencePiece), LLaMA-3, SmolLM2,
# GPT-2, Qwen2, Phi-3, MPT and Falcon vocabularies: N of them joined by spaces are exactly N tokens there.
_WORD_LIST = (
    "time year people way day man thing woman life child world school state family student group country problem "
    "hand part place case week company system program question work government number night point home water room "
    "mother area money story fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war history party result "
    "change morning reason research girl food moment air teacher force education"
)
_WORDS = _WORD_LIST.split()


@dataclass(frozen=True)
class PromptSet:
    """Prompts from a file (cycled), or synthetic prompts of ``words`` one-token words, different for every index
    so that no server can answer them from a prefix cache."""

    prompts: tuple[Prompt, ...] = ()
    words: int = 128
    source: str = ""

    def get(self, index: int) -> Prompt:
        if self.prompts:
            return self.prompts[index % len(self.prompts)]
        rng = random.Random(index)
        return Prompt(text=" ".join(rng.choice(_WORDS) for _ in range(self.words)))

    def describe(self) -> str:
        return self.source or f"synthetic, {self.words} one-token words"


def load_prompts(path: Path) -> PromptSet:
    """Read a prompt file: ``.jsonl`` lines of a JSON string, ``{"prompt": ...}`` or ``{"messages": [...]}``;
    any other file: one text prompt per non-empty line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise BenchError(f"--prompts: cannot read {path}: {e.strerror}") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        prompts.append(_jsonl_prompt(path, n, line) if path.suffix == ".jsonl" else Prompt(text=line))
    if not prompts:
        raise BenchError(f"--prompts: {path} holds no prompts (expected one per line)")
    return PromptSet(prompts=tuple(prompts), source=f"{path.name} ({len(prompts)} prompts)")


def _jsonl_prompt(path: Path, n: int, line: str) -> Prompt:
    where = f"--prompts: {path.name} line {n}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BenchError(f"{where}: not JSON ({e.msg}); use a .txt file for plain text lines") from None
    if isinstance(obj, str):
        return Prompt(text=obj)
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
        return Prompt(text=obj["prompt"])
    if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
        msgs = obj["messages"]
        if all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
               for m in msgs) and msgs:
            return Prompt(messages=tuple((m["role"], m["content"]) for m in msgs))
        raise BenchError(f"{where}: 'messages' must be a non-empty list of {{'role': str, 'content': str}}")
    raise BenchError(f"{where}: expected a JSON string, {{\"prompt\": str}} or {{\"messages\": [...]}}")


def request_body(cfg: BenchConfig, prompt: Prompt) -> dict[str, Any]:
    """The JSON body of one streaming request."""
    body: dict[str, Any] = {
        "model": cfg.model,
        "max_tokens": cfg.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.chat:
        msgs = prompt.messages or (("user", prompt.text),)
        body["messages"] = [{"role": r, "content": c} for r, c in msgs]
    elif prompt.messages:
        raise BenchError("a prompt file with 'messages' needs --chat (it targets /v1/chat/completions)")
    else:
        body["prompt"] = prompt.text
    return body


@dataclass(frozen=True)
class StreamEvent:
    """What one server-sent ``data:`` line said."""

    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    error: str | None = None
    done: bool = False


def parse_sse_line(line: str) -> StreamEvent | None:
    """Parse one line of an OpenAI streaming response; ``None`` for lines that carry no data (blank, comments,
    ``event:``). Handles both ``choices[].text`` (completions) and ``choices[].delta.content`` (chat)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return StreamEvent(done=True)
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        return StreamEvent(error=f"malformed stream data: {data[:200]!r}")
    if not isinstance(obj, dict):
        return StreamEvent(error=f"unexpected stream data: {data[:200]!r}")
    if obj.get("error"):
        err = obj["error"]
        return StreamEvent(error=str(err.get("message", err) if isinstance(err, dict) else err))
    text, finish = "", None
    for choice in obj.get("choices") or ():
        delta = choice.get("delta") or {}
        text += choice.get("text") or delta.get("content") or ""
        finish = choice.get("finish_reason") or finish
    usage = obj.get("usage") or {}
    return StreamEvent(text=text, finish_reason=finish, completion_tokens=usage.get("completion_tokens"),
                       prompt_tokens=usage.get("prompt_tokens"))


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
    usage_reported: bool = False
    finish_reason: str | None = None


@dataclass
class LevelRun:
    """Every request of one concurrency level and the level's wall time (first send to last answer)."""

    concurrency: int
    wall_seconds: float
    results: list[RequestResult]
    client_cpu_share: float = 0.0  # this process's CPU time / wall time: near 1.0, the client limited the level


def base_url(url: str) -> str:
    """``http://host:port``, ``.../`` and ``.../v1`` all name the same server."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def send_one(conn: Connection, cfg: BenchConfig, prompt: Prompt) -> RequestResult:
    """Send one streaming request and time it. Never raises for server or network failures: they become
    ``error``."""
    path = "/v1/chat/completions" if cfg.chat else "/v1/completions"
    res = RequestResult()
    body = json.dumps(request_body(cfg, prompt)).encode()
    t0 = res.sent_at = time.perf_counter()
    done = False
    try:
        async with asyncio.timeout(cfg.timeout):
            resp = await conn.post(path, body, _headers(cfg.api_key))
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
                    if ev.completion_tokens is not None:
                        res.output_tokens, res.usage_reported = ev.completion_tokens, True
                        res.prompt_tokens = ev.prompt_tokens
                    res.finish_reason = ev.finish_reason or res.finish_reason
    except StreamClientError as e:
        res.error = str(e)
    except TimeoutError:
        res.error = f"no complete answer within --timeout {cfg.timeout:g} s"
        await conn.close()
    res.latency = time.perf_counter() - t0
    if res.error is None and not done and res.finish_reason is None:
        res.error = "the stream ended without [DONE] or a finish_reason"
    if not res.usage_reported:
        res.output_tokens = len(res.chunk_times)
    res.ok = res.error is None
    return res


async def run_level(cfg: BenchConfig, prompts: PromptSet, concurrency: int, first_index: int,
                    on_result: Callable[[RequestResult], None]) -> LevelRun:
    """``concurrency`` workers, each on its own keep-alive connection, send requests back to back until the
    level's count or duration is used up."""
    limit = cfg.requests_for(concurrency)
    counter = itertools.count(first_index)
    results: list[RequestResult] = []
    origin = Origin.parse(base_url(cfg.url))
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    deadline = t0 + cfg.duration if cfg.duration is not None else None

    async def worker() -> None:
        conn = Connection(origin, connect_timeout=min(cfg.timeout, 30.0))
        try:
            while True:
                i = next(counter)
                if limit is not None and i - first_index >= limit:
                    return
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                res = await send_one(conn, cfg, prompts.get(i))
                results.append(res)
                on_result(res)
        finally:
            await conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return LevelRun(concurrency, wall, results, client_cpu_share=(time.process_time() - cpu0) / wall if wall else 0.0)


async def run_async(cfg: BenchConfig, prompts: PromptSet, progress: bool = True) -> list[LevelRun]:
    """Warm up, then run every concurrency level in order."""
    runs: list[LevelRun] = []
    conn = Connection(Origin.parse(base_url(cfg.url)), connect_timeout=min(cfg.timeout, 30.0))
    try:
        for i in range(cfg.warmup):
            res = await send_one(conn, cfg, prompts.get(-1 - i))
            if not res.ok:
                hint = ("; this server refuses the extra field ignore_eos: run again with --no-ignore-eos"
                        if cfg.ignore_eos and "ignore_eos" in (res.error or "") else "")
                raise BenchError(f"the warm-up request to {cfg.url} failed: {res.error}{hint}")
    finally:
        await conn.close()
    index = 0
    for c in cfg.concurrency:
        total = cfg.requests_for(c)
        with tqdm(total=total, desc=f"concurrency {c}", unit="req", disable=not progress, leave=True) as bar:
            errors = 0

            def tick(res: RequestResult) -> None:
                nonlocal errors
                errors += not res.ok
                bar.update(1)
                if errors:
                    bar.set_postfix(errors=errors)

            run = await run_level(cfg, prompts, c, index, tick)
        runs.append(run)
        index += len(run.results)
    return runs


def run(cfg: BenchConfig, prompts: PromptSet, progress: bool = True) -> list[LevelRun]:
    """Blocking wrapper of :func:`run_async`, on uvloop where it is installed (a cheaper event loop leaves more
    of the client's one core for reading streams)."""
    try:
        import uvloop
        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(run_async(cfg, prompts, progress))


def resolve_model(url: str, api_key: str | None, timeout: float = 30.0) -> str:
    """The first model the server lists at ``/v1/models``; raises :class:`BenchError` with the fix otherwise."""
    target = base_url(url) + "/v1/models"
    try:
        resp = httpx.get(target, headers=_headers(api_key), timeout=timeout)
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach {target} ({type(e).__name__}: {e}); start the server or fix --url") from None
    if resp.status_code != 200:
        raise BenchError(f"{target} answered HTTP {resp.status_code}; pass the model name with --model")
    try:
        data = resp.json().get("data") or []
        return str(data[0]["id"])
    except (ValueError, AttributeError, LookupError, TypeError):
        raise BenchError(f"{target} lists no models; pass the model name with --model") from None
