"""Which tokens go into the next ``llama_decode``: continuous batching under an ``n_batch`` token budget.

Pure logic, no llama.cpp calls. Generating sequences go first (one token each, so every running answer advances
every step); prompts are then prefilled in chunks, oldest first, with whatever budget is left. A long prompt is thus
spread over several steps alongside the running decodes instead of stalling them.
"""

from __future__ import annotations

from llamafleet.engine.sequence import Sequence


def schedule(running: list[Sequence], budget: int, rotate: int = 0) -> list[tuple[Sequence, int]]:
    """Return ``(sequence, n_tokens)`` pairs for the next step, using at most ``budget`` tokens.

    ``running`` is in admission order. ``rotate`` shifts which generating sequences go first when there are more of
    them than budget (so none starves); with ``budget >= len(running)`` it has no effect.
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
        plan.append((s, 1))
        budget -= 1
    for s in prefilling:
        if budget <= 0:
            break
        n = min(s.pending, budget)
        plan.append((s, n))
        budget -= n
    return plan
