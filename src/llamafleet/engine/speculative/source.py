"""Where drafts come from: the interface every draft source implements, and prompt lookup (n-gram), the first.

A source is one per engine and keeps what it needs per slot. The engine tells it when a sequence starts in a slot
(with its prompt) and when the slot is given up, and once per step asks it for drafts for every sequence that
speculates, all at once (:meth:`DraftSource.propose`), so a source that runs a model drafts for the whole batch in
one pass of its own. Each ask carries the sequence's tokens as they now are (prompt and verified answer, never a
rejected draft): a source with state of its own (a draft model's KV in slots that mirror the target's) compares
them with what it holds and cuts back to the common prefix, so a rejection needs no separate call. Drafts are
single proposals (a token per position, no distribution): the verifier's rule for them is in
:mod:`llamafleet.engine.speculative.verify`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Ask:
    """Draft at most ``n`` tokens to follow ``tokens`` (the sequence in ``slot``: prompt and answer so far)."""

    slot: int
    tokens: Sequence[int]
    n: int


class DraftSource(Protocol):
    """A draft source: prompt lookup here, a draft model (:mod:`llamafleet.engine.speculative.draft_model`); a draft
    head (EAGLE/MTP-style, fed the target's hidden states) or llama.cpp's own speculative helpers fit the same
    three calls."""

    def start(self, slot: int, tokens: Sequence[int]) -> None:
        """A sequence starts in ``slot`` with ``tokens`` (its prompt); whatever the slot held before is gone."""

    def propose(self, asks: list[Ask]) -> list[list[int]]:
        """Drafts for every ask, in order: up to ``n`` tokens each, possibly none."""

    def stop(self, slot: int) -> None:
        """The sequence in ``slot`` has ended: free what the source keeps for it."""


class NgramIndex:
    """Every n-gram (``n_min`` to ``n_max`` tokens) of one sequence, mapped to the position that followed its latest
    occurrence; updated incrementally as the sequence grows, so a lookup is a few dictionary reads."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.sizes = range(n_max, n_min - 1, -1)  # longest first: a longer match predicts better
        self._after: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self._next = n_min  # the next end position to index (the n-grams that end just before it)

    def update(self, tokens: Sequence[int]) -> None:
        """Index the n-grams that end before the last token (their next token is known)."""
        for end in range(self._next, len(tokens)):
            for n in self.sizes:
                if end >= n:
                    self._after[n][tuple(tokens[end - n:end])] = end
        self._next = max(self._next, len(tokens))

    def draft(self, tokens: Sequence[int], k: int) -> list[int]:
        """The tokens that followed the latest earlier occurrence of ``tokens``' longest indexed tail, up to ``k``.

        Where they run into the end of ``tokens`` (the tail recurs every ``p`` tokens, ``p`` under ``k``: a loop
        such as a repeated word or a row of dashes), the loop is drafted on: the last ``p`` tokens again and again."""
        self.update(tokens)
        for n in self.sizes:
            at = self._after[n].get(tuple(tokens[len(tokens) - n:])) if len(tokens) >= n else None
            if at is not None:
                out = list(tokens[at:at + k])
                period = len(tokens) - at
                out += [out[i % period] for i in range(len(out), k)]
                return out
        return []


class NgramSource:
    """Prompt lookup: drafts copied from the sequence's own prompt and answer, where its last few tokens occurred
    before (editing, rewriting, quoting a document, code). No model: a miss costs a few dictionary reads."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self._index: dict[int, NgramIndex] = {}

    def start(self, slot: int, tokens: Sequence[int]) -> None:
        self._index[slot] = NgramIndex(self.n_min, self.n_max)

    def propose(self, asks: list[Ask]) -> list[list[int]]:
        return [self._index[a.slot].draft(a.tokens, a.n) for a in asks]

    def stop(self, slot: int) -> None:
        self._index.pop(slot, None)
