"""When a KV tier's copy pays, from measured rates, and how much copying one engine step may do.

A tier's save (``llama_state_seq_get_data_ext``) and restore (``_set_data_ext``) run inside the engine's step, so
every running sequence waits for them. On a CPU they cost a few microseconds per token where prefilling costs
milliseconds; on a fast GPU the other way round (an H200 prefilled 4,200 tokens of a 7B model in 0.4 s and took
1.5 s to copy their 2 GiB state to host memory: docs/BENCHMARKS.md). So :class:`CopyCosts` keeps three measured
rates, in seconds per token, each an exponential average:

- ``prefill``: passes that were mostly prompt (the engine reports every pass with :data:`MIN_PASS_TOKENS` prompt
  tokens or more: the pass's time over its tokens);
- ``save``: the tier's saves (the copy out of llama.cpp over the tokens it held);
- ``restore``, per tier: restores (for the disk tier, reading and checking the file too).

and two rules on them: a state is saved only if saving it and restoring it once cost less than prefilling its
tokens again (:meth:`CopyCosts.worth_saving`), and a state is restored only if that costs less than prefilling what
it adds over what the slot already holds (:meth:`CopyCosts.worth_restoring`). A rate not measured yet says yes (the
copy measures it). A rule that says no keeps its rates as they were: it is not asked to measure again.

:class:`StepBudget` bounds the copies of one step: once a step's saves and restores took longer than the engine's
last pass (or ``copy_budget_s``), further prompts wait for the next step, so the running sequences get a pass
between a burst's copies instead of waiting for all of them. Pure logic, no llama.cpp calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SMOOTH = 0.3  # weight of the newest measurement in a rate
MIN_PASS_TOKENS = 32  # prompt tokens a pass needs for its time to count as a prefill rate


@dataclass
class Rate:
    """Seconds per token, an exponential average of measurements (None: none yet)."""

    per_token: float | None = None

    def add(self, seconds: float, tokens: int) -> None:
        if tokens <= 0 or seconds < 0:
            return
        v = seconds / tokens
        self.per_token = v if self.per_token is None else (1 - SMOOTH) * self.per_token + SMOOTH * v


@dataclass
class CopyCosts:
    """The measured rates of one engine and the rules on them (see the module's docstring)."""

    prefill: Rate = field(default_factory=Rate)
    save: Rate = field(default_factory=Rate)
    restore: dict[str, Rate] = field(default_factory=lambda: {"ram": Rate(), "disk": Rate()})

    def worth_saving(self) -> bool:
        """Whether a state saved now (and restored once later, from RAM) costs less than prefilling its tokens
        again. Per token: the three costs grow with the tokens alike."""
        p, s = self.prefill.per_token, self.save.per_token
        if p is None or s is None:
            return True
        return s + (self.restore["ram"].per_token or 0.0) < p

    def worth_restoring(self, tier: str, tokens: int, gained: int) -> bool:
        """Whether restoring a state of ``tokens`` tokens from ``tier`` costs less than prefilling the ``gained``
        tokens it adds over what the slot holds."""
        p, r = self.prefill.per_token, self.restore[tier].per_token
        if p is None or r is None:
            return True
        return r * tokens < p * gained


class StepBudget:
    """The seconds of tier copies one engine step may spend before further prompts wait for the next step: a
    fixed ``budget_s``, or (None) the duration of the engine's last pass. The first copy of a step is always
    allowed."""

    def __init__(self, budget_s: float | None) -> None:
        self.fixed = budget_s
        self.last_pass_s = 0.0
        self.spent = 0.0
        self.copies = 0
        self.deferrals = 0  # steps that put a prompt off to the next one, in all

    def new_step(self) -> None:
        self.spent = 0.0
        self.copies = 0

    def add(self, seconds: float) -> None:
        self.spent += seconds
        self.copies += 1

    def spent_out(self) -> bool:
        """Whether this step has copied its share: the next prompt waits (counted in :attr:`deferrals`)."""
        limit = self.last_pass_s if self.fixed is None else self.fixed
        if self.copies and self.spent >= limit:
            self.deferrals += 1
            return True
        return False
