"""How much to draft, per sequence and per step.

A sequence drafts ``k`` tokens, at most ``max_draft``; ``k`` follows its recent acceptance and what a drafted token
costs. Whether drafting pays at all depends on the machine: on a GPU decoding a few streams, a pass of a few more
tokens costs about what one costs; on a CPU each token costs nearly its own share. :class:`PassCost` fits the time
of recent passes as ``a + b * tokens``; with ``r = b / (a + b * N)`` (one more token's share of a step of ``N``) and
the sequence's estimated chance ``p`` that a draft token is right given the ones before it were (its recent
verifications: kept tokens over kept tokens plus rejections), ``k`` drafts are worth it when the step's expected
tokens per unit of time grow: ``(R + p + p^2 + ... + p^k) / (1 + r k) > R`` for a step that yields ``R`` tokens
without them. The ``k`` that gains most is drafted, or none; a sequence that gets none still probes with one token
every :data:`PROBE` steps, so its estimate can recover. So sustained acceptance lets ``k`` grow to ``max_draft``
(long copied spans keep their full drafts) where tokens are cheap, and a rejection lowers ``p`` a little rather than
cutting the next draft to the part kept: in copying work a miss (a changed word) is followed by long runs again,
which a draft trimmed after each miss would give up (a replay of the demo model's edit answers:
docs/BENCHMARKS.md). The step-wide rule (no drafts once more than ``max_batch`` sequences decode) is
:meth:`Speculator.draft`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROBE = 16  # steps: a sequence whose drafts do not pay drafts one token this often, to keep its estimate fresh
KEEP = 0.9  # weight of the past in the running estimates (acceptance per verification, cost per pass)


@dataclass
class Track:
    """One speculating sequence: the drafts in the pass now running, and its counts."""

    max_draft: int
    draft: list[int] = field(default_factory=list)  # in the pass now running (empty: it drafted nothing)
    drafted: int = 0  # tokens drafted and verified over the request
    accepted: int = 0  # of those, tokens the target agreed with
    hits: float = 1.0  # running counts behind the chance that a drafted token is right (a prior of 1 in 2)
    trials: float = 2.0
    idle: int = 0  # steps since it last drafted because drafting did not pay

    @property
    def p(self) -> float:
        """The estimated chance that a drafted token is right, given the ones before it were."""
        return self.hits / self.trials

    def worth(self, limit: int, r: float, base: int) -> int:
        """How many tokens to draft (at most ``limit``) in a step of ``base`` tokens where one more token costs ``r``
        of the step: the most gainful number, 0 if none gains (then one, every :data:`PROBE` steps, unless
        ``r * base >= 1``: there even drafts that are always right lose)."""
        best, gain, expected, term = 0, 1.0, float(base), 1.0
        for k in range(1, limit + 1):
            term *= self.p
            expected += term
            if (g := expected / (base * (1.0 + r * k))) > gain:
                best, gain = k, g
        if best or limit < 1 or r * base >= 1.0:  # (then even drafts always right would not pay: no probe)
            self.idle = 0
            return best
        self.idle += 1
        if self.idle >= PROBE:
            self.idle = 0
            return 1
        return 0

    def settle(self, accepted: int) -> None:
        """The target accepted the first ``accepted`` tokens of :attr:`draft`: update the counts and ``p``."""
        n = len(self.draft)
        self.drafted += n
        self.accepted += accepted
        self.draft = []
        self.hits = KEEP * self.hits + accepted
        self.trials = KEEP * self.trials + accepted + (accepted < n)


class PassCost:
    """The time of a pass as ``a + b * tokens``, fitted by least squares on recent passes (older ones weigh less)."""

    def __init__(self) -> None:
        self._s = [0.0] * 5  # weighted sums of 1, x, y, x*x, x*y (x: tokens, y: seconds)

    def observe(self, tokens: int, seconds: float) -> None:
        x, y = float(tokens), seconds
        self._s = [KEEP * s + v for s, v in zip(self._s, (1.0, x, y, x * x, x * y), strict=True)]

    def fit(self) -> tuple[float, float] | None:
        """``(a, b)``, ``b`` 0 while passes of only one size were seen (then ``a`` is their mean time);
        None before any pass."""
        n, sx, sy, sxx, sxy = self._s
        if n <= 0:
            return None
        var = n * sxx - sx * sx
        if n < 2 or var <= 1e-9 * n * n:
            return sy / n, 0.0
        b = max(0.0, (n * sxy - sx * sy) / var)
        return (sy - b * sx) / n, b

    def seconds(self, tokens: int) -> float:
        """The expected time of a pass of ``tokens`` (0 before any pass)."""
        a, b = self.fit() or (0.0, 0.0)
        return a + b * tokens

    def share(self, tokens: int) -> float:
        """One more token's cost as a share of a pass of ``tokens`` (0 until passes of different sizes were seen)."""
        _, b = self.fit() or (0.0, 0.0)
        whole = self.seconds(tokens)
        return b / whole if whole > 0 else 0.0
