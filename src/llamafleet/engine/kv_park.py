"""The park tier: KV of sessions whose slot was given to another prompt, kept inside the context, not copied out.

The context holds ``n_park + 1`` more sequences than the engine has slots (sequence ids ``n_seq`` and up, each a KV
stream of ``n_ctx_per_seq`` cells, never decoded): ``n_park`` sessions, and a spare for the step in which a slot's old
KV is parked before the returning session's leaves the park. Before a slot's KV is overwritten, :meth:`ParkTier.park`
moves it into a free parked sequence with ``llama_memory_seq_cp``; a later prompt that starts with what it holds gets it
back the same way (:meth:`ParkTier.restore`), and only the rest is prefilled. With one KV stream per sequence (the
engine's layout) such a copy is a copy of the whole stream inside the backend's memory (on a GPU, device to device),
queued until the next ``llama_decode`` applies it, in the order the copies were made: no host memory, no serialization,
no cost that grows with the number of parked sessions. llama.cpp applies the queued copies before it places that
decode's tokens, so a slot can be parked and given to the next prompt in the same step.

What is parked is keyed by the tokens it holds; a full park gives up the session expected back last
(:mod:`llamafleet.engine.kv_order`: not the least recently used, which in sessions taking turns is the next to
return). A session whose next turn is restored gives its parked sequence back (what the slot holds now extends it, and
is parked again when the slot is taken, with the return interval learned), unless the restored prompt leaves
:attr:`min_reuse` or more of its tokens behind (a branch: both stay reusable). A sequence that leaves the park for room
goes to the RAM tier by the copy rules of :mod:`llamafleet.engine.kv_tiers` (``spill``).

Copies queued but not applied are llama.cpp's to order, but a state read or written at once is not: a sequence
copied into is not read (its data is not there yet) and one copied out of is not written until the next decode
(:attr:`Context.copy_targets`, :attr:`Context.copy_sources`). Pure bookkeeping around the memory calls of
:class:`~llamafleet.engine.llama.Context`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from llamafleet.engine.kv_order import Clock, ReturnOrder
from llamafleet.engine.prefix import common_prefix

if TYPE_CHECKING:  # only a type: this module's unit tests load no llama.cpp
    from llamafleet.engine.llama import Context

Spill = Callable[[int, list[int], int | None], None]  # (parked sequence id, its tokens, its session's return
# interval): save it elsewhere, now


class ParkTier:
    """``n`` parked sessions in sequence ids ``first .. first + n`` (one more than ``n``: see :meth:`park`)."""

    def __init__(self, first: int, n: int, min_reuse: int, clock: Clock) -> None:
        self.first, self.limit, self.min_reuse = first, n, min_reuse
        self._free = list(range(first, first + n + 1))
        self._held: OrderedDict[int, list[int]] = OrderedDict()  # parked sequence id -> its tokens, LRU first
        self._order: ReturnOrder[int] = ReturnOrder(clock)
        self.parks = 0  # slots' KV parked
        self.evictions = 0  # parked sequences given up for room (spilled)

    @property
    def entries(self) -> int:
        return len(self._held)

    def held(self) -> list[tuple[int, list[int]]]:
        """Every parked sequence and its tokens, the most recently used first."""
        return [(seq, list(t)) for seq, t in reversed(self._held.items())]

    def parked(self) -> list[tuple[int, list[int]]]:
        """Every parked sequence and its tokens (not copied: not to be changed)."""
        return list(self._held.items())

    def covers(self, tokens: list[int]) -> bool:
        n = len(tokens)
        return any(len(t) >= n and t[:n] == tokens for t in self._held.values())

    def best(self, prompt: list[int], cap: int) -> tuple[int | None, int]:
        """The parked sequence holding the longest prefix of ``prompt`` (at most ``cap`` tokens) and its length."""
        seq, n = None, 0
        for k, t in self._held.items():
            m = common_prefix(prompt, t, cap)
            if m > n:
                seq, n = k, m
        return seq, n

    def park(self, ctx: Context, slot: int, tokens: list[int], spill: Spill, keep: int | None = None,
             freeing: bool = False, interval: int | None = None) -> bool:
        """Move what ``slot`` holds (``tokens``) into a parked sequence before the slot is overwritten; False if no
        sequence could take it (every one has a copy into it queued, or is ``keep``: the one the slot's next prompt
        is about to be restored from). Parked prefixes of ``tokens`` are given up (it serves them); the least
        parked sequence expected back last is ``spill``-ed for room, unless ``freeing``: ``keep`` is about to be moved
        out (:meth:`moves`), so the spare sequence takes ``tokens`` for the step in which both are parked (the slot's
        old KV must be copied out before the returning session's is copied in). ``interval``: the session's return
        interval, where it was learned (:mod:`llamafleet.engine.kv_order`)."""
        if self.covers(tokens):
            return True
        for seq in [k for k, t in self._held.items() if len(t) < len(tokens) and tokens[:len(t)] == t]:
            interval = interval or self._order.interval(seq)
            self.forget(seq)
        into = self._room(ctx, spill, keep, freeing)
        if into is None:
            return False
        ctx.copy_sequence(slot, into)
        self._held[into] = list(tokens)
        self._order.add(into, interval)
        self.parks += 1
        return True

    def take(self, ctx: Context, tokens: list[int], spill: Spill, interval: int | None = None) -> int | None:
        """A parked sequence nothing is queued into or out of, made free for ``tokens`` to be written into it at once
        (a RAM or disk state on its way into a slot whose old KV a queued copy still reads); None if there is none."""
        clean = [s for s in self._free if s not in ctx.copy_sources and s not in ctx.copy_targets]
        if not clean:
            seq = self._order.victim(k for k in self._held if k not in ctx.copy_sources and k not in ctx.copy_targets)
            if seq is None:
                return None
            self._evict(seq, spill)
            clean = [seq]
        self._free.remove(clean[0])
        self._held[clean[0]] = list(tokens)
        self._order.add(clean[0], interval)
        return clean[0]

    def moves(self, seq: int, n: int) -> bool:
        """Whether restoring the first ``n`` tokens of parked sequence ``seq`` gives it back (fewer than
        ``min_reuse`` of its tokens lie beyond them)."""
        return len(self._held[seq]) - n < self.min_reuse

    def restore(self, ctx: Context, seq: int, slot: int, n: int) -> int:
        """Make ``slot`` hold what parked sequence ``seq`` holds (the caller keeps its first ``n`` tokens); ``seq`` is
        given back if it :meth:`moves`. The session's return interval, learned now."""
        ctx.copy_sequence(seq, slot)
        interval = self._order.hit(seq)
        if self.moves(seq, n):
            self.forget(seq)
        else:
            self._held.move_to_end(seq)
        return interval

    def _room(self, ctx: Context, spill: Spill, keep: int | None, freeing: bool) -> int | None:
        while len(self._held) >= self.limit + freeing or not self._free:
            # one whose data is not there yet cannot be saved
            seq = self._order.victim(k for k in self._held if k not in ctx.copy_targets and k != keep)
            if seq is None:
                return None
            self._evict(seq, spill)
        return self._free.pop(0)

    def _evict(self, seq: int, spill: Spill) -> None:
        spill(seq, self._held[seq], self._order.interval(seq))
        self.evictions += 1
        self.forget(seq)

    def forget(self, seq: int) -> None:
        """Parked sequence ``seq`` is free again (what it holds is given up)."""
        del self._held[seq]
        self._order.drop(seq)
        self._free.append(seq)
