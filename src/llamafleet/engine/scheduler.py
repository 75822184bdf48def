"""Which waiting request gets the next free slot (:class:`Waiting`), and which tokens go into the next
``llama_decode``: continuous batching under an ``n_batch`` token budget (:func:`schedule`).

Admission: a request's ``priority`` (0 interactive, 1 default, 2 batch: the API key's class) orders the waiting
requests, lower first; within one priority, the request of the tenant (API key) holding the fewest slots goes first,
oldest first among equals, so a tenant with 100 requests queued does not push back one with a single request: it
gets the next slot that frees. Aging keeps a lower class from starving: each time a request of a better priority is
admitted past a waiting one, that one counts a pass, and every :data:`AGING_PASSES` passes raise it one class.
Running answers are never preempted, so better work can only take a slot that frees: the batch class is kept out of
the last free slot (of an engine with two or more) while better work arrived in the last :data:`RESERVE_S` seconds,
so that an interactive request finds a slot at once instead of waiting for a batch answer to end. With every request
of one priority and tenant (no tenants configured), admission is first come, first served, into every slot.

Tokens, pure logic, no llama.cpp calls: generating sequences go first (one token each, so every running answer advances
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

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from llamafleet.engine.sequence import Sequence
from llamafleet.engine.types import Request

AGING_PASSES = 8  # admissions of a better class past a waiting request that raise it one class
BATCH = 2  # the batch class (and worse): kept out of the last free slot while better work is about
RESERVE_S = 30.0  # how long after better work last arrived that slot stays kept


@dataclass
class _Entry:
    req: Request
    passed: int = 0

    @property
    def rank(self) -> int:
        return self.req.priority - self.passed // AGING_PASSES


class Waiting:
    """The requests waiting for one of ``slots`` slots, in arrival order; :meth:`pop` takes the one to admit next;
    ``clock``: seconds (for :data:`RESERVE_S`)."""

    def __init__(self, slots: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: list[_Entry] = []
        self._reserve = slots >= 2
        self._clock = clock
        self._better_at = -math.inf  # when a request of a class better than batch last arrived

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Request]:
        return (e.req for e in self._entries)

    def append(self, req: Request) -> None:
        if req.priority < BATCH:
            self._better_at = self._clock()
        self._entries.append(_Entry(req))

    def remove(self, request_id: str) -> Request | None:
        """Take ``request_id`` out (None: it is not waiting)."""
        for i, e in enumerate(self._entries):
            if e.req.request_id == request_id:
                return self._entries.pop(i).req
        return None

    def pop(self, running: Iterable[Sequence], free: int) -> Request | None:
        """The request to admit next into one of ``free`` slots, given the sequences ``running`` (their tenants'
        slots); None: only batch work waits, and the last free slot is kept (see the module doc)."""
        entries = self._entries
        kept = self._reserve and free <= 1 and self._clock() - self._better_at < RESERVE_S
        able = [i for i, e in enumerate(entries) if not kept or e.rank < BATCH]
        if len(able) <= 1:
            return entries.pop(able[0]).req if able else None
        held = Counter(s.req.tenant for s in running)
        best = min(able, key=lambda i: (entries[i].rank, held[entries[i].req.tenant], i))
        chosen = entries.pop(best)
        for e in entries:
            if e.rank > chosen.rank:
                e.passed += 1
        return chosen.req


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
