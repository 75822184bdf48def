"""Which waiting request gets the next free slot (:class:`Waiting`), and which tokens go into the next
``llama_decode``: continuous batching under an ``n_batch`` token budget (:func:`schedule`).

Admission: a request's ``priority`` (0 interactive, 1 default, 2 batch: the API key's class) orders the waiting
requests, lower first; within one priority, the request of the tenant (API key) holding the fewest slots goes first,
oldest first among equals, so a tenant with 100 requests queued does not push back one with a single request: it
gets the next slot that frees. Aging keeps a lower class from starving: each time a request of a better priority is
admitted past a waiting one, that one counts a pass, and every :data:`AGING_PASSES` passes raise it one class. With
every request of one priority and tenant (no tenants configured), admission is first come, first served.

Tokens:

Pure logic, no llama.cpp calls. Generating sequences go first (one token each, so every running answer advances
every step, plus the tokens drafted for it when it speculates: engine/speculative/ keeps them within the budget);
prompts are then prefilled in chunks, oldest first, with whatever budget is left. A long prompt is thus
spread over several steps alongside the running decodes instead of stalling them.

The chosen pairs are returned in slot order. With one KV stream per sequence, llama.cpp splits a batch into
micro-batches that may only hold *consecutive* sequence ids (``split_equal`` with ``sequential``); a batch in
admission order after slots were reused (e.g. slots 5, 2, 7, 3) ran as one micro-batch per sequence and made a
loaded H200 ~4x slower. Slot order, plus the engine always taking the lowest free slot, keeps the runs long.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from llamafleet.engine.sequence import Sequence
from llamafleet.engine.types import Request

AGING_PASSES = 8  # admissions of a better class past a waiting request that raise it one class


@dataclass
class _Entry:
    req: Request
    passed: int = 0

    @property
    def rank(self) -> int:
        return self.req.priority - self.passed // AGING_PASSES


class Waiting:
    """The requests waiting for a slot, in arrival order; :meth:`pop` takes the one to admit next."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Request]:
        return (e.req for e in self._entries)

    def append(self, req: Request) -> None:
        self._entries.append(_Entry(req))

    def remove(self, request_id: str) -> Request | None:
        """Take ``request_id`` out (None: it is not waiting)."""
        for i, e in enumerate(self._entries):
            if e.req.request_id == request_id:
                return self._entries.pop(i).req
        return None

    def pop(self, running: Iterable[Sequence]) -> Request:
        """The request to admit next, given the sequences ``running`` (their tenants' slots); see the module doc."""
        entries = self._entries
        if len(entries) == 1:
            return entries.pop().req
        held = Counter(s.req.tenant for s in running)
        best = min(range(len(entries)), key=lambda i: (entries[i].rank, held[entries[i].req.tenant], i))
        chosen = entries.pop(best)
        for e in entries:
            if e.rank > chosen.rank:
                e.passed += 1
        return chosen.req


def schedule(running: list[Sequence], budget: int, rotate: int = 0,
             prefill_budget: int | None = None) -> list[tuple[Sequence, int]]:
    """Return ``(sequence, n_tokens)`` pairs for the next step, using at most ``budget`` tokens.

    ``running`` is in admission order. ``rotate`` shifts which generating sequences go first when there are more of
    them than budget (so none starves); with ``budget >= len(running)`` it has no effect. ``prefill_budget`` caps
    the prompt tokens of the step (None: whatever the running answers leave of ``budget``).
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
    for s in prefilling:
        if budget <= 0:
            break
        n = min(s.pending, budget)
        plan.append((s, n))
        budget -= n
    plan.sort(key=lambda p: p[0].slot)
    return plan
