"""Load generator for any OpenAI-compatible endpoint (llamafleet, llama-server, vLLM, Ollama): a concurrency sweep.

For each concurrency level, that many workers send streaming requests back to back (``/v1/completions``, or
``/v1/chat/completions`` with ``chat``) until the level's request count or duration is used up. Every request
records, from the client's side (see :mod:`llamafleet.bench.streaming`): time to the first content chunk (TTFT), the
arrival time of every content chunk (inter-token latency), end-to-end latency, and its output token count, taken
from the server's ``usage`` (asked for with ``stream_options.include_usage``) or, where a server sends none, from
the number of content chunks. Every request gets a different prompt, so no prefix cache can help; the multi-turn
workload that measures prefix reuse is :mod:`llamafleet.bench.multiturn`.

Statistics and files are :mod:`llamafleet.bench.report`'s job; this module only measures.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from llamafleet.bench.client import Connection
from llamafleet.bench.prompts import Prompt, PromptSet
from llamafleet.bench.streaming import BenchError, RequestResult, Target, counting, run_blocking, send, warm_up


@dataclass(frozen=True)
class BenchConfig(Target):
    """What to send and how hard. ``requests`` (per level) and ``duration`` (seconds per level) exclude each other;
    with neither, each level sends ``4 x concurrency`` requests (at least 16)."""

    concurrency: tuple[int, ...] = (1, 8, 32)
    requests: int | None = None
    duration: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError("concurrency needs one or more positive levels, e.g. 1,8,32")
        if self.requests is not None and self.duration is not None:
            raise ValueError("give either requests (per level) or duration (seconds per level), not both")
        if self.requests is not None and self.requests < 1:
            raise ValueError("requests must be >= 1")
        if self.duration is not None and self.duration <= 0:
            raise ValueError("duration must be > 0 seconds")

    def requests_for(self, concurrency: int) -> int | None:
        """Requests to send at this level; ``None`` in duration mode."""
        if self.duration is not None:
            return None
        return self.requests if self.requests is not None else max(16, 4 * concurrency)


def request_body(cfg: BenchConfig, prompt: Prompt) -> dict[str, Any]:
    """The JSON body of one streaming request."""
    body = cfg.body()
    if cfg.chat:
        msgs = prompt.messages or (("user", prompt.text),)
        body["messages"] = [{"role": r, "content": c} for r, c in msgs]
    elif prompt.messages:
        raise BenchError("a prompt file with 'messages' needs --chat (it targets /v1/chat/completions)")
    else:
        body["prompt"] = prompt.text
    return body


@dataclass
class LevelRun:
    """Every request of one concurrency level and the level's wall time (first send to last answer)."""

    concurrency: int
    wall_seconds: float
    results: list[RequestResult]
    client_cpu_share: float = 0.0  # this process's CPU time / wall time: near 1.0, the client limited the level


async def run_level(cfg: BenchConfig, prompts: PromptSet, concurrency: int, first_index: int,
                    on_result: Callable[[RequestResult], None]) -> LevelRun:
    """``concurrency`` workers, each on its own keep-alive connection, send requests back to back until the
    level's count or duration is used up."""
    limit = cfg.requests_for(concurrency)
    counter = itertools.count(first_index)
    results: list[RequestResult] = []
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    deadline = t0 + cfg.duration if cfg.duration is not None else None

    async def worker(conn: Connection) -> None:
        try:
            while True:
                i = next(counter)
                if limit is not None and i - first_index >= limit:
                    return
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                res = await send(conn, cfg, request_body(cfg, prompts.get(i)))
                results.append(res)
                on_result(res)
        finally:
            await conn.close()

    await asyncio.gather(*(worker(cfg.connection()) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return LevelRun(concurrency, wall, results, client_cpu_share=(time.process_time() - cpu0) / wall if wall else 0.0)


async def run_async(cfg: BenchConfig, prompts: PromptSet, progress: bool = True) -> list[LevelRun]:
    """Warm up, then run every concurrency level in order."""
    await warm_up(cfg, lambda i: request_body(cfg, prompts.get(-1 - i)))
    runs: list[LevelRun] = []
    index = 0
    for c in cfg.concurrency:
        total = cfg.requests_for(c)
        with tqdm(total=total, desc=f"concurrency {c}", unit="req", disable=not progress, leave=True) as bar:
            run = await run_level(cfg, prompts, c, index, counting(bar))
        runs.append(run)
        index += len(run.results)
    return runs


def run(cfg: BenchConfig, prompts: PromptSet, progress: bool = True) -> list[LevelRun]:
    """Blocking wrapper of :func:`run_async`."""
    return run_blocking(run_async(cfg, prompts, progress))
