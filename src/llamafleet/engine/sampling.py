"""Choosing the next token for every sequence that produced logits this step.

Plain greedy requests (no penalties) are sampled for the whole batch with one vectorised ``argmax`` (or, with
backend sampling on, inside llama.cpp's graph, so no logits reach the host); the rest use
their own llama.cpp sampler chain (penalties, top-k/top-p/min-p, temperature, seeded draw). Log-probabilities of the
chosen tokens come from the raw logits with one vectorised log-softmax, only for requests that asked for them.
"""

from __future__ import annotations

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
        tokens[:] = np.argmax(logits, axis=1)
    elif greedy:
        tokens[greedy] = np.argmax(logits[greedy], axis=1)
    for i, (s, bidx) in enumerate(outputs):
        if s.chain is not None:
            tokens[i] = s.chain.sample(ctx, bidx)
    want = [i for i, (s, _) in enumerate(outputs) if s.req.params.logprobs]
    if not want:
        return tokens, None
    rows = logits[want].astype(np.float64)
    m = rows.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(rows - m).sum(axis=1, keepdims=True)))[:, 0]
    logprobs = np.zeros(n, dtype=np.float32)
    logprobs[want] = rows[np.arange(len(want)), tokens[want]] - lse
    return tokens, logprobs
