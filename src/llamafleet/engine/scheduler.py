"""Which waiting request gets the next free slot (:class:`Waiting`), and which tokens go into the next
``llama_decode``: continuous batching under an ``n_batch`` token budget (:func:`schedule`).

Admission: a request's ``priority`` (0 interactive, 1 default, 2 batch: the API key's class) orders the waiting
requests, lower first; within one priority, the request of the tenant (API key) holding the fewest slots goes first,
oldest first among equals, so a tenant with 100 requests queued does not push back one with a single request: it
gets the next slot that frees. Aging keeps a lower class from starving: each time a request of a better priority is
admitted past a tenant's oldest waiting request, that one counts a pass, and every :data:`AGING_PASSES` passes raise
it one class. Only the oldest of each tenant counts them: the others would not have had that slot anyway, and when
every waiting request counted, a batch flood of 200 aged whole after 8 interactive requests and took back the slot
kept for them (below).
Running answers are never preempted, so better work can only take a slot that frees: the batch class is kept out of
the last free slot (of an engine with two or more) while better work arrived in the last ``reserve_s`` seconds
(:class:`~llamafleet.engine.types.PriorityConfig`), so that an interactive request finds a slot at once instead of
waiting for a batch answer to end. With every request of one priority and tenant (no tenants configured), admission is
first come, first served, into every slot.

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

Batch work beside better work. Once admitted, a better request still shares its prompt's pass with the batch
sequences in the other slots, and it arrives while a batch pass runs, which it must wait for. On a CPU, where a pass
costs its tokens, both made its first token 2-3x as late under a batch flood (docs/BENCHMARKS.md, Tenants). So, by the
pass's fitted cost ``a + b * tokens`` (:class:`Shares`, the ``priorities`` settings):

* beside a better prompt's chunk, batch work (its decode rows first, rotating, then its prompts' chunks, oldest first)
  adds at most ``batch_share`` (0.1) to the pass's cost: ``n`` batch tokens beside ``k`` better ones add ``b n`` to
  ``a + b k``, so it takes ``n <= share (a / b + k)`` of them, and at least one while a better prompt's prefill goes
  on after the pass (batch answers slow down, never stop); better prompts are prefilled before batch prompts, whatever
  their age;
* while better work is about (a request of a better class than batch arrived in the last ``reserve_s`` seconds), a
  pass of batch work alone holds its decode rows and only as many prompt tokens (at least one) as keep the pass's
  fixed cost ``a`` at ``batch_alone_cost`` (0.1) of its time: ``a / (a + b n) >= cost``, so the batch work loses at
  most about that share of its speed, and a better request arriving finds a short pass to wait for.

On a GPU, where ``a / b`` is hundreds of tokens, both hold every batch token and nothing changes; on a CPU (``a / b``
0.5-2 tokens) a short interactive prompt's pass takes no batch token along instead of every batch answer's, and batch
prompts are prefilled in chunks of a few to a dozen tokens. The passes of better answers (after their first token)
are not limited. Without better work, without batch work, or before passes of different sizes were measured, nothing
changes.

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
from llamafleet.engine.types import PriorityConfig, Request

AGING_PASSES = 8  # admissions of a better class past a waiting request that raise it one class
BATCH = 2  # the batch class (and worse): kept out of the last free slot, and limited in passes, beside better work


@dataclass(frozen=True)
class Shares:
    """What batch work may take: ``beside`` a better prompt, the most it adds to the pass's cost; ``alone``, while
    better work is about (None or 0: it is not, or no limit), the most a pass's fixed cost may be of a pass of batch
    work alone (see the module doc)."""

    beside: float
    alone: float | None


@dataclass
class _Entry:
    req: Request
    passed: int = 0

    @property
    def rank(self) -> int:
        return self.req.priority - self.passed // AGING_PASSES


class Waiting:
    """The requests waiting for one of ``slots`` slots, in arrival order; :meth:`pop` takes the one to admit next,
    :meth:`shares` what batch work may take of the next pass; ``clock``: seconds."""

    def __init__(self, slots: int = 1, clock: Callable[[], float] = time.monotonic,
                 priorities: PriorityConfig | None = None) -> None:
        self._entries: list[_Entry] = []
        self._rules = priorities or PriorityConfig()
        self._reserve = slots >= 2 and self._rules.reserve_s > 0
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

    def _about(self) -> bool:
        """Whether better work arrived in the last ``reserve_s`` seconds."""
        return self._clock() - self._better_at < self._rules.reserve_s

    def shares(self) -> Shares | None:
        """What batch work may take of the next pass (None: no limit)."""
        r = self._rules
        return None if r.batch_share is None else Shares(r.batch_share, r.batch_alone_cost if self._about() else None)

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
        kept = self._reserve and free <= 1 and self._about()
        able = [i for i, e in enumerate(entries) if not kept or e.rank < BATCH]
        if len(able) <= 1:
            return entries.pop(able[0]).req if able else None
        held = Counter(s.req.tenant for s in running)
        best = min(able, key=lambda i: (entries[i].rank, held[entries[i].req.tenant], i))
        chosen = entries.pop(best)
        oldest: dict[tuple[int, str], _Entry] = {}
        for e in entries:
            oldest.setdefault((e.req.priority, e.req.tenant), e)
        for e in oldest.values():
            if e.rank > chosen.rank:
                e.passed += 1
        return chosen.req


def schedule(running: list[Sequence], budget: int, rotate: int = 0, prefill_budget: int | None = None,
             join_tokens: float | None = None, shares: Shares | None = None) -> list[tuple[Sequence, int]]:
    """Return ``(sequence, n_tokens)`` pairs for the next step, using at most ``budget`` tokens.

    ``running`` is in admission order. ``rotate`` shifts which generating sequences go first when there are more of
    them than budget (so none starves); with ``budget >= len(running)`` it has no effect. ``prefill_budget`` caps
    the prompt tokens of the step (None: whatever the running answers leave of ``budget``). ``join_tokens``: the
    tokens a pass's fixed cost is worth, ``a / b`` (None: unmeasured, or tokens cost nothing), which decides whether a
    prompt's chunk joins a pass already holding other prompts' (see above; None: always). ``shares``: what batch work
    may take of the pass (see above; None: no limit).
    """
    batch = [s for s in running if s.req.priority >= BATCH]
    better = [s for s in running if s.req.priority < BATCH]
    if shares is None or join_tokens is None or not batch:
        plan, _, _ = _pack(running, budget, rotate, prefill_budget, join_tokens)
    elif any(s.pending > 1 for s in better):  # a better prompt is prefilled: batch work takes a share of its pass
        plan, budget, prefill_left = _pack(better, budget, rotate, prefill_budget, join_tokens)
        allowed = int(shares.beside * (join_tokens + sum(n for _, n in plan)))
        planned = dict(plan)
        if any(s.pending > 1 and planned.get(s, 0) < s.pending for s in better):
            allowed = max(allowed, 1)  # a better prompt goes on after this pass: batch answers must not stop
        extra, _, _ = _pack(batch, min(budget, allowed), rotate, min(prefill_left, allowed), None)
        plan += extra
    elif not better and shares.alone:  # batch work alone while better work is about: short passes
        rows = sum(1 + s.n_draft for s in batch if s.pending == 1)
        prompt = max(1, math.ceil(join_tokens * (1 - shares.alone) / shares.alone) - rows)
        plan, _, _ = _pack(batch, budget, rotate, prompt if prefill_budget is None else min(prefill_budget, prompt),
                           join_tokens)
    else:
        plan, _, _ = _pack(running, budget, rotate, prefill_budget, join_tokens)
    plan.sort(key=lambda p: p[0].slot)
    return plan


def _pack(running: list[Sequence], budget: int, rotate: int, prefill_budget: int | None,
          join_tokens: float | None) -> tuple[list[tuple[Sequence, int]], int, int]:
    """:func:`schedule` without its batch rule: the plan, in admission order, the budget left and the prompt tokens
    the prefill budget leaves."""
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
    prompt_left = budget if prefill_budget is None else min(budget, prefill_budget)
    for i, s in enumerate(prefilling):
        if prompt_left <= 0:
            break
        n = min(s.pending, prompt_left)
        if i and join_tokens is not None and i * n > (len(prefilling) - i) * join_tokens:
            break  # cheaper for it to wait for the next pass (and for the prompts after it: oldest first)
        plan.append((s, n))
        prompt_left -= n
        budget -= n
    return plan, budget, prompt_left
