"""How much to draft, per sequence and per step.

A sequence drafts ``k`` tokens; ``k`` follows its recent acceptance: all accepted doubles it (up to ``max_draft``),
a rejection after ``a`` accepted sets it to ``a + 1``, and a draft rejected outright makes the sequence skip
drafting for a while, longer after each such miss in a row (1, 3, 7, 15 steps). Finding no draft costs the n-gram
source a few dictionary reads, so it pauses nothing. The step-wide rule (no
drafts once more than ``max_batch`` sequences decode) is :meth:`Speculator.draft`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_PAUSE = 15  # steps: the longest a sequence goes without drafting after drafts kept failing


@dataclass
class Track:
    """One speculating sequence: the drafts in the pass now running, the next draft length, and its counts."""

    max_draft: int
    k: int = 0  # tokens to draft next time (0: max_draft)
    draft: list[int] = field(default_factory=list)  # in the pass now running (empty: it drafted nothing)
    drafted: int = 0  # tokens drafted and verified over the request
    accepted: int = 0  # of those, tokens the target agreed with
    misses: int = 0  # draft attempts in a row that gained nothing
    pause: int = 0  # steps left before it drafts again

    def __post_init__(self) -> None:
        self.k = self.k or self.max_draft

    def ready(self) -> bool:
        """Whether it drafts this step (a paused sequence counts down)."""
        if self.pause:
            self.pause -= 1
            return False
        return True

    def settle(self, accepted: int) -> None:
        """The target accepted the first ``accepted`` tokens of :attr:`draft`: update the counts and ``k``."""
        n = len(self.draft)
        self.drafted += n
        self.accepted += accepted
        self.draft = []
        if accepted == n:
            self.k = min(self.max_draft, 2 * self.k)
        else:
            self.k = max(1, accepted + 1)
        if accepted:
            self.misses = 0
        else:
            self.misses += 1
            self.pause = min(MAX_PAUSE, 2 ** self.misses - 1)
