"""One step's plan written into llama.cpp's batch: tokens, positions, sequence ids, and which rows produce logits.

The engine (:mod:`llamafleet.engine.engine`) schedules ``(sequence, tokens)`` pairs
(:mod:`llamafleet.engine.scheduler`); :func:`fill` lays them out. A step of one token per sequence, each sampled
(the common decode step), is filled directly; one with prompt chunks (or drafts) with a few array operations over
the whole plan, no Python work per token. An entry whose tokens reach the end of what it has produces logits at
its last token (and at its drafts, engine/speculative/); prompts scored for ``prompt_logprobs`` at every position
(:func:`llamafleet.engine.sampling.scoring_rows`).
"""

from __future__ import annotations

import itertools

import numpy as np

from llamafleet.engine.llama import Batch
from llamafleet.engine.sampling import Rows, scoring_rows
from llamafleet.engine.sequence import Sequence
from llamafleet.engine.speculative.speculator import Speculator


def fill(b: Batch, plan: list[tuple[Sequence, int]]) -> tuple[list[tuple[Sequence, int]], Rows | None]:
    """Write ``plan`` into ``b`` (sets ``b.n_tokens``). Returns the (sequence, batch index) pairs to sample, and
    where the logits rows are when the pass scores prompts (None otherwise)."""
    n = len(plan)
    if all(k == 1 and s.n_cached + 1 == len(s.tokens) for s, k in plan):  # one token each, each sampled
        b.token[:n] = [s.tokens[s.n_cached] for s, _ in plan]
        b.pos[:n] = [s.n_cached for s, _ in plan]
        b.seq[:n] = [s.slot for s, _ in plan]
        b.logits[:n] = 1
        b.n_tokens = n
        return [(s, i) for i, (s, _) in enumerate(plan)], None
    counts = np.fromiter((k for _, k in plan), dtype=np.int32, count=len(plan))
    n = int(counts.sum())
    b.token[:n] = list(itertools.chain.from_iterable(s.feed(k) for s, k in plan))
    first = np.cumsum(counts) - counts  # batch index of each entry's first token
    starts = np.fromiter((s.n_cached for s, _ in plan), dtype=np.int32, count=len(plan))
    b.pos[:n] = np.repeat(starts - first, counts) + np.arange(n, dtype=np.int32)
    b.seq[:n] = np.repeat(np.fromiter((s.slot for s, _ in plan), dtype=np.int32, count=len(plan)), counts)
    b.logits[:n] = 0
    sampled = [(s, int(first[i] + k - 1 - s.n_draft)) for i, (s, k) in enumerate(plan)
               if s.n_cached + k == len(s.tokens) + s.n_draft]
    b.logits[[bi for _, bi in sampled]] = 1
    Speculator.flag(sampled, b.logits)
    b.n_tokens = n
    return sampled, scoring_rows(plan, first, sampled, b.logits[:n])
