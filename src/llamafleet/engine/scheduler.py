"""Which tokens go into the next ``llama_decode``: continuous batching under an ``n_batch`` token budget.

Pure logic, no llama.cpp calls. Generating sequences go first (one token each, so every running answer advances
every step, plus the tokens drafted for it when it speculates: engine/speculative/ keeps them within the budget);
prompts are then prefilled in chunks, oldest first, with whatever budget is left. A long prompt is thus
spread over several steps alongside the running decodes instead of stalling them.

Several prompts share a pass only while that is cheap. A pass costs about ``a + b * tokens`` (measured by the
engine); two prompts of ``k1`` and ``k2`` tokens in one pass both get their first token after ``a + b (k1 + k2)``,
one after the other after ``a + b k1`` and ``2a + b (k1 + k2)``: the mean is lower whenever ``b k2 > a``. In
general a chunk of ``k`` tokens joining a pass that holds ``i`` prompts' chunks delays those ``i`` by ``b k``, and
spares itself and the ``r - 1`` prompts queued behind it a pass's fixed cost ``a``: it joins if ``i k <= r a / b``
(``join_tokens`` is ``a / b``). On a GPU, where a pass's fixed cost is large, prompts still share passes (a burst
of many fills them); on a CPU, where a pass costs its tokens, a few prompts arriving together are prefilled one after
the other, oldest first, and the first one's answer starts as soon as its own prompt is done.

The chosen pairs are returned in slot order. With one KV stream per sequence, llama.cpp splits a batch into
micro-batches that may only hold *consecutive* sequence ids (``split_equal`` with ``sequential``); a batch in
admission order after slots were reused (e.g. slots 5, 2, 7, 3) ran as one micro-batch per sequence and made a
loaded H200 ~4x slower. Slot order, plus the engine always taking the lowest free slot, keeps the runs long.
"""

from __future__ import annotations

from llamafleet.engine.sequence import Sequence


def schedule(running: list[Sequence], budget: int, rotate: int = 0, prefill_budget: int | None = None,
             join_tokens: float | None = None) -> list[tuple[Sequence, int]]:
    """Return ``(sequence, n_tokens)`` pairs for the next step, using at most ``budget`` tokens.

    ``running`` is in admission order. ``rotate`` shifts which generating sequences go first when there are more of
    them than budget (so none starves); with ``budget >= len(running)`` it has no effect. ``prefill_budget`` caps
    the prompt tokens of the step (None: whatever the running answers leave of ``budget``). ``join_tokens``: the
    tokens a pass's fixed cost is worth, which decides whether a prompt's chunk joins a pass already holding other
    prompts' (see above; None: always).
    """
    decoding = [s for s in running if s.pending == 1]
    prefilling = [s for s in running if s.pending > 1]
    if len(decoding) > budget and decoding:
        k = rotate % len(decoding)
        decoding = decoding[k:] + decoding[:k]
    plan: list[tuple[Sequence, int]] = []
    for s in decoding:
        if budget <= 0:
            break
        plan.append((s, 1 + s.n_draft))
        budget -= 1 + s.n_draft
    if prefill_budget is not None:
        budget = min(budget, prefill_budget)
    for i, s in enumerate(prefilling):
        if budget <= 0:
            break
        n = min(s.pending, budget)
        if i and join_tokens is not None and i * n > (len(prefilling) - i) * join_tokens:
            break  # cheaper for it to wait for the next pass (and for the prompts after it: oldest first)
        plan.append((s, n))
        budget -= n
    plan.sort(key=lambda p: p[0].slot)
    return plan
