"""Choosing the next token for every sequence that produced logits this step.

Plain greedy requests (no penalties) are sampled for the whole batch with one vectorised ``argmax`` (or, with
backend sampling on, inside llama.cpp's graph, so no logits reach the host); the rest use
their own llama.cpp sampler chain (penalties, top-k/top-p/min-p, temperature, seeded draw, and a grammar for
structured output), one sequence after another, so a constrained neighbour costs plain greedy ones nothing but
its own time in the step. Log-probabilities of the
chosen tokens come from the raw logits with one vectorised log-softmax, only for requests that asked for them; so
do their top alternatives (one ``argpartition`` over those rows) and the scores of prompt tokens (:func:`score`).
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from llamafleet.engine.cores import host_cores
from llamafleet.engine.llama import Context
from llamafleet.engine.sequence import Sequence
from llamafleet.engine.types import TopLogprobs

Sampled = tuple[npt.NDArray[np.int64], npt.NDArray[np.float32] | None, list[TopLogprobs | None] | None]

_SCORE_ROWS = 64  # rows turned to float64 at a time: 64 x a 128k vocabulary is 64 MB


def score(logits: npt.NDArray[np.float32], targets: npt.NDArray[np.int64], top_n: int
          ) -> tuple[npt.NDArray[np.float32], list[TopLogprobs] | None]:
    """Log-softmax of each row of ``logits`` at its ``targets`` token, and (``top_n`` > 0) the ``top_n`` most likely
    tokens of each row with their logprobs, best first."""
    lps = np.empty(len(targets), dtype=np.float32)
    tops: list[TopLogprobs] | None = [] if top_n else None
    for a in range(0, len(targets), _SCORE_ROWS):
        rows = logits[a:a + _SCORE_ROWS].astype(np.float64)
        m = rows.max(axis=1, keepdims=True)
        lse = m + np.log(np.exp(rows - m).sum(axis=1, keepdims=True))
        lps[a:a + len(rows)] = rows[np.arange(len(rows)), targets[a:a + _SCORE_ROWS]] - lse[:, 0]
        if tops is not None:
            best = np.argpartition(-rows, top_n - 1, axis=1)[:, :top_n]
            vals = np.take_along_axis(rows, best, axis=1) - lse
            order = np.argsort(-vals, axis=1, kind="stable")
            best, vals = np.take_along_axis(best, order, axis=1), np.take_along_axis(vals, order, axis=1)
            tops += [list(zip(b.tolist(), v.tolist(), strict=True)) for b, v in zip(best, vals, strict=True)]
    return lps, tops


def sample(ctx: Context, outputs: list[tuple[Sequence, int]], n_rows: int | None = None,
           rows: npt.NDArray[np.int64] | None = None) -> Sampled:
    """``outputs`` lists (sequence, batch index) in the order of the logits rows (or, when the pass produced other
    rows too, ``n_rows`` of them, at ``rows``). Returns tokens, logprobs and top alternatives (None: none asked)."""
    n = len(outputs)
    tokens = np.empty(n, dtype=np.int64)
    if ctx.backend_sampling:
        for i, (s, bidx) in enumerate(outputs):
            if s.in_graph:
                tokens[i] = ctx.sampled_token(bidx)
        if all(s.in_graph for s, _ in outputs):
            return tokens, None, None
    logits = ctx.logits(n) if rows is None or n_rows is None else ctx.logits(n_rows)[rows]
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
        return tokens, None, None
    top_n = max(outputs[i][0].req.params.top_logprobs for i in want)
    logprobs = np.zeros(n, dtype=np.float32)
    logprobs[want], tops = score(logits[want], tokens[want], top_n)
    if tops is None:
        return tokens, logprobs, None
    by_output: list[TopLogprobs | None] = [None] * n
    for i, top in zip(want, tops, strict=True):
        by_output[i] = top[:outputs[i][0].req.params.top_logprobs]
    return tokens, logprobs, by_output


# Below this many logits one argmax call is cheaper than handing parts to threads.
_PARALLEL_MIN = 1 << 20
_pool: ThreadPoolExecutor | None = None


@functools.cache
def _threads() -> int:
    return min(8, host_cores())


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


Rows = tuple[int, npt.NDArray[np.int64], list[tuple[Sequence, int, int, int]]]  # (rows, sampled rows, scored)


def scoring_rows(plan: list[tuple[Sequence, int]], first: npt.NDArray[np.int32], sampled: list[tuple[Sequence, int]],
                 flags: npt.NDArray[np.int8]) -> Rows | None:
    """For a pass with prompts being scored: set ``flags`` (the batch's logits flags) at every position of their
    chunks, and say where the logits rows land: how many there are, the rows of ``sampled``, and per scored chunk
    (sequence, first row, first position, positions). None when the pass scores nothing (rows = sampled, in order)."""
    scored = [(s, int(first[i]), s.n_cached, k) for i, (s, k) in enumerate(plan)
              if s.scores is not None and s.n_cached < s.n_prompt - 1]
    if not scored:
        return None
    for _, bi, _, k in scored:
        flags[bi:bi + k] = 1
    flagged = np.flatnonzero(flags)
    return (len(flagged), np.searchsorted(flagged, [bi for _, bi in sampled]),
            [(s, int(np.searchsorted(flagged, bi)), at, k) for s, bi, at, k in scored])


def score_prompts(logits: npt.NDArray[np.float32], scored: list[tuple[Sequence, int, int, int]]) -> None:
    """Add to each prompt's scores those of one pass: ``scored`` lists (sequence, first logits row, first position,
    positions) for the chunks of prompts being scored; the row of position ``p`` scores prompt token ``p + 1``."""
    for s, row, at, k in scored:
        assert s.scores is not None
        m = min(k, s.n_prompt - 1 - at)  # the last prompt position's row is the first answer token's, sampled
        targets = np.asarray(s.req.prompt_tokens[at + 1:at + 1 + m], dtype=np.int64)
        lps, tops = score(logits[row:row + m], targets, s.req.params.top_logprobs)
        s.scores.logprobs += lps.tolist()
        if s.scores.top is not None and tops is not None:
            s.scores.top += tops
