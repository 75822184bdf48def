"""A reasoning budget: a thinking model's think block closed, with the family's own close marker, once it has spent
its tokens.

A request's ``think_budget`` (:class:`~llamafleet.engine.types.SamplingParams`) counts the tokens generated inside
the think block: from the first token when the prompt opened the block, else from the model's own open marker. When
the count reaches the budget and the block is still open, the next tokens are the close marker's, forced by raising
their logits far above the rest of the sequence's row (so a grammar sees and accepts them as if sampled; one it
refuses is not forced further); then the model goes on with its answer. The model may close the block itself
before: nothing is forced then, nor while it is writing the close marker. The markers are read from the tokens'
text, a few characters of it kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from llamafleet.engine.families import Family

FORCE = 1000.0  # logits above the best: a sure pick at any temperature this server allows


@dataclass
class ThinkBudget:
    limit: int
    think: tuple[str, str]  # the family's open and close markers
    close_ids: tuple[int, ...]  # the close marker's tokens
    inside: bool = False  # in the think block now
    spent: int = 0  # tokens generated inside it
    over: bool = False  # the block was closed (by the model or forced): nothing more to watch
    forcing: list[int] = field(default_factory=list)  # the close marker's tokens still to force
    tail: str = ""  # the last characters of the answer, to find the markers in

    @classmethod
    def of(cls, limit: int | None, family: Family | None, tokenize: Callable[[str], list[int]],
           opened: bool) -> ThinkBudget | None:
        """The budget of a request (None when it has none, or its model does not think)."""
        if limit is None or family is None or family.think is None:
            return None
        return cls(limit, family.think, tuple(tokenize(family.think[1])), inside=opened)

    def next_forced(self) -> int | None:
        """The token that must come next (None: the model picks)."""
        return self.forcing[0] if self.forcing else None

    def force(self, logits: npt.NDArray[np.float32]) -> None:
        """Make the forced token, when there is one, the sure pick of ``logits`` (a sequence's row): far above every
        other, which stay, so a grammar that refuses it still finds its own pick among them."""
        tok = self.next_forced()
        if tok is not None:
            logits[tok] = float(np.max(logits)) + FORCE

    def saw(self, token: int, text: bytes) -> None:
        """One more generated token (its id and text)."""
        if self.over:
            return
        if self.forcing:  # a forced token (another one only if a grammar refused it: then forcing stops)
            expected = self.forcing.pop(0)
            if token != expected or not self.forcing:
                self.over, self.forcing = True, []
            return
        self.tail = (self.tail + text.decode("utf-8", errors="replace"))[-64:]
        if not self.inside:
            if self.think[0] in self.tail:
                self.inside, self.tail = True, ""
            return
        if self.think[1] in self.tail:
            self.over = True
            return
        self.spent += 1
        closing = any(self.tail.endswith(self.think[1][:k]) for k in range(1, len(self.think[1])))
        if self.spent >= self.limit and not closing:  # (the model may be closing the block itself: let it)
            self.forcing = list(self.close_ids)
