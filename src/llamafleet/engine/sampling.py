"""Choosing the next token for every sequence that produced logits this step.

Plain greedy requests (no penalties) are sampled for the whole batch with one vectorised ``argmax`` (or, with
backend sampling on, inside llama.cpp's graph, so no logits reach the host); the rest use
their own llama.cpp sampler chain (penalties, top-k/top-p/min-p, temperature, seeded draw, and a grammar for
structured output), one sequence after another, so a constrained neighbour costs plain greedy ones nothing but
its own time in the step. Log-probabilities of the
chosen tokens come from the raw logits with one vectorised log-softmax, only for requests that asked for them.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from llamafleet.engine.llama import Context
from llamafleet.engine.sequence import Sequence


def sample(
    ctx: Context, outputs: list[tuple[Sequence, int]]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32] | None]:
    """``outputs`` lists (sequence, batch index) in the order of the logits rows. Returns tokens and logprobs."""
    n = len(outputs)
    tokens = np.empty(n, dtype=np.int64)
    if ctx.backend_sampling:
        for i, (s, bidx) in enumerate(outputs):
            if s.in_graph:
                tokens[i] = ctx.sampled_token(bidx)
        if all(s.in_graph for s, _ in outputs):
            return tokens, None
    logits = ctx.logits(n)
    greedy = [i for i, (s, _) in enumerate(outputs) if s.chain is None and not s.in_graph]
    if len(greedy) == n:
        tokens[:] = argmax_rows(logits)
    elif greedy:
        tokens[greedy] = argmax_rows(logits[greedy])
    for i, (s, _) in enumerate(outputs):
        if s.chain is not None:
            tokens[i] = s.chain.sample(ctx, logits[i])
    want = [i for i, (s, _) in enumerate(outputs) if s.req.params.logprobs]
    if not want:
        return tokens, None
    rows = logits[want].astype(np.float64)
    m = rows.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(rows - m).sum(axis=1, keepdims=True)))[:, 0]
    logprobs = np.zeros(n, dtype=np.float32)
    logprobs[want] = rows[np.arange(len(want)), tokens[want]] - lse
    return tokens, logprobs


# Below this many logits one argmax call is cheaper than handing parts to threads.
_PARALLEL_MIN = 1 << 20
_pool: ThreadPoolExecutor | None = None


@functools.cache
def _threads() -> int:
    return min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def argmax_rows(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.int64]:
    """Row-wise argmax. A big batch (128 rows x 32k vocab = 16 MB) is split over a few threads, since numpy releases
    the GIL inside argmax. Whether that pays off right after a decode is not settled: on a 2-core machine it did not,
    and scripts/decode_probe.py times both ways on a GPU (see docs/BENCHMARKS.md)."""
    global _pool
    rows = logits.shape[0]
    n = min(_threads(), rows)
    if logits.size < _PARALLEL_MIN or n < 2:
        single: npt.NDArray[np.int64] = np.argmax(logits, axis=1)
        return single
    if _pool is None:
        _pool = ThreadPoolExecutor(_threads(), thread_name_prefix="argmax")
    out = np.empty(rows, dtype=np.int64)
    bounds = np.linspace(0, rows, n + 1).astype(int)

    def part(i: int) -> None:
        a, b = bounds[i], bounds[i + 1]
        out[a:b] = np.argmax(logits[a:b], axis=1)

    list(_pool.map(part, range(n)))
    return out
