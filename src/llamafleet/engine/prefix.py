"""Prefix reuse inside one engine: which slot a new prompt takes, and which KV it can start from.

Every chat turn, agent step and RAG call re-sends a prefix the engine has already computed. A finished sequence's
KV therefore stays in its slot (which is free) until the slot is taken again, and :class:`SlotIndex` remembers what
every slot holds: the sequence that ran (or runs) there, whose ``tokens[:n_cached]`` are in the KV cache. Token
lists compared with C-speed slice equality are enough at these sizes (128 slots x a few thousand tokens).

A new prompt is placed by :meth:`SlotIndex.place`, in this order of preference:

1. **In place**: a free slot already holding at least :data:`MIN_REUSE` tokens of the prompt is taken; the engine
   cuts its KV after the match (``llama_memory_seq_rm``) and prefills only the rest. Among equal matches the least
   recently used slot is taken (its content is the one given up). Taking a slot other than the lowest free one may
   leave a gap between running slots; llama.cpp puts only consecutive sequence ids into one micro-batch (see
   :mod:`llamafleet.engine.scheduler`), so the slot order rule yields only to a reuse of that size.
2. **Copy**: the lowest free slot is taken and the longest prefix held by *any other* slot (running, or free and
   warm) is copied into it. With one KV stream per sequence (``kv_unified=False``, kept for decode speed)
   ``llama_memory_seq_cp`` copies a whole stream: every cell of every layer, whatever is used, queued until the
   next ``llama_decode``; ranges assert. The engine copies the whole stream and cuts the tail. The copy's cost
   depends on the context per sequence, not on the prefix; measured on CPU it costs what prefilling a few tokens
   costs (docs/BENCHMARKS.md, "Prefix reuse on CPU"), so a copy is made whenever it gains :data:`MIN_REUSE` tokens.
3. **Wait**: a prompt whose longest prefix is still being prefilled by another sequence (a burst of requests with
   one system prompt, or ``n`` choices of one prompt) takes the lowest free slot but is not scheduled until that
   sequence's KV covers the shared prefix, then copies it: the prefix is prefilled once, not once per request. The
   wait costs it no time: prompts are prefilled oldest first, so it would have waited behind that prefill anyway.
4. Otherwise the lowest free slot, as without reuse, keeping whatever prefix of the prompt that slot holds.

So a slot's KV is given up when its slot is taken. A prompt that reuses nothing takes the lowest free slot, not the
least recently used one: running slots kept together are worth more on a GPU than a later cache hit. Least recently
used decides among free slots that hold equally long matches (many slots with the same system prompt).

A prompt is never taken whole from the cache: its last token is decoded again, because that is what produces
the logits of the first answer token. Pure logic, no llama.cpp calls: the engine applies each placement with the
memory calls of :mod:`llamafleet.engine.llama`.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

MIN_REUSE = 32  # tokens: the least reuse worth leaving the slot order, a copy, or a wait for


class Held(Protocol):
    """What ``slot``'s KV holds: ``tokens[:n_cached]`` now, and the whole prompt once its prefill is done."""

    @property
    def slot(self) -> int: ...

    @property
    def tokens(self) -> list[int]: ...

    @property
    def n_cached(self) -> int: ...

    @property
    def n_prompt(self) -> int: ...


H = TypeVar("H", bound=Held)


@dataclass(frozen=True)
class Placement(Generic[H]):
    """Where a new sequence goes and how much of its prompt it starts with in its KV (``reuse`` tokens).

    ``source is None``: the slot's own KV keeps its first ``reuse`` tokens. Otherwise ``source``'s whole KV is
    copied into ``slot`` and cut to ``reuse`` tokens: now, or, with ``wait``, once ``source`` has computed them.
    ``lost`` is the sequence whose KV ``slot`` held until now (given up, but for the ``reuse`` tokens kept in
    place); ``best`` the longest prefix of the prompt any slot held, used or not (where a miss differed).
    """

    slot: int
    reuse: int = 0
    source: H | None = None
    wait: bool = False
    lost: H | None = None
    best: int = 0


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of two lists of tokens, at most ``limit`` (slice equality, no Python loop
    per token: a binary search compares each part once)."""
    hi = min(len(a), len(b), limit)
    if hi <= 0 or a[0] != b[0]:
        return 0
    if a[:hi] == b[:hi]:
        return hi
    lo = 1  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class SlotIndex(Generic[H]):
    """Free slots and what every slot's KV holds. ``enabled=False``: no reuse, the lowest free slot, as before."""

    def __init__(self, n_slots: int, enabled: bool = True, min_reuse: int = MIN_REUSE) -> None:
        self.enabled = enabled
        self.min_reuse = min_reuse
        self._free = list(range(n_slots))  # a min-heap: the lowest free slot is the default choice
        self._held: list[H | None] = [None] * n_slots
        self._used: list[int] = [0] * n_slots  # when each slot was last released (LRU among equal matches)
        self._clock = 0

    @property
    def n_free(self) -> int:
        return len(self._free)

    def holds(self, h: H) -> bool:
        """Whether ``h``'s slot still holds ``h``'s KV (not taken by another sequence, not forgotten)."""
        return self._held[h.slot] is h

    def place(self, prompt: Sequence[int], reuse: bool = True) -> Placement[H]:
        """Choose a free slot for ``prompt`` and what it starts from (see the module's docstring); call
        :meth:`take` next. There must be a free slot. ``reuse=False`` (a prompt whose every token must be computed,
        e.g. to score it): the lowest free slot, starting empty."""
        lowest = self._free[0]
        if not self.enabled or not reuse:
            return Placement(lowest, lost=self._held[lowest])
        prompt = list(prompt)
        cap = len(prompt) - 1  # the last prompt token is always decoded: it yields the first answer's logits
        free = set(self._free)
        here = (0, 0, lowest)  # (tokens reusable, -last use, -slot) of the best free slot, in place
        other: tuple[int, int] = (0, 0)  # (tokens, slot) of the best ready prefix in any slot
        later: tuple[int, int, int] = (0, 0, 0)  # (tokens, tokens ready, slot) of a prefix still being prefilled
        for slot, h in enumerate(self._held):
            if h is None:
                continue
            ready = common_prefix(prompt, h.tokens, min(cap, h.n_cached))
            if slot in free and ready and (ready >= self.min_reuse or slot == lowest):
                here = max(here, (ready, -self._used[slot], -slot))
            other = max(other, (ready, slot))
            if slot not in free and h.n_cached < h.n_prompt:
                planned = common_prefix(prompt, h.tokens, min(cap, h.n_prompt))
                later = max(later, (planned, h.n_cached, -slot))
        best_here, slot = here[0], -here[2]
        best = max(other[0], later[0])
        if later[0] >= max(best_here, other[0]) + self.min_reuse:
            return Placement(lowest, later[0], self._held[-later[2]], wait=True, lost=self._held[lowest], best=best)
        if other[0] >= best_here + self.min_reuse:
            return Placement(lowest, other[0], self._held[other[1]], lost=self._held[lowest], best=best)
        slot = slot if best_here else lowest
        return Placement(slot, best_here, lost=self._held[slot], best=best)

    def contents(self) -> list[tuple[int, list[int]]]:
        """Every slot that holds KV and the tokens it holds, the most recently used first."""
        held = [(slot, h) for slot, h in enumerate(self._held) if h is not None and h.n_cached]
        held.sort(key=lambda x: -self._used[x[0]] if x[0] in self._free else -self._clock - 1)
        return [(slot, list(h.tokens[:h.n_cached])) for slot, h in held]

    def holders(self) -> list[tuple[int, H]]:
        """Every slot whose KV is offered to later prompts and the sequence that ran (or runs) there."""
        return [(slot, h) for slot, h in enumerate(self._held) if h is not None]

    def take(self, h: H, shared: bool = True) -> None:
        """``h`` now runs in its slot, which was free (that KV is ``h``'s from now on); ``shared=False``: its KV is
        never offered to another prompt (it was computed with other weights: a LoRA adapter's)."""
        self._free.remove(h.slot)
        heapq.heapify(self._free)
        self._held[h.slot] = h if shared else None

    def release(self, slot: int, keep: bool = True) -> None:
        """``slot`` is free again; its KV stays reusable unless ``keep`` is False (its content is unknown)."""
        self._clock += 1
        self._used[slot] = self._clock
        if not keep or not self.enabled:
            self._held[slot] = None
        heapq.heappush(self._free, slot)
