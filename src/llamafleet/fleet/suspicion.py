"""Suspect replicas: a worker silent for longer than its own recent steps explain gets no new work, long before it
is found hung.

A loaded worker talks to the API process all the time: one message per engine step that produced anything, a
heartbeat from its engine loop after ``beat_s`` without one, and, while one step runs longer than that (a long
prefill on a slow CPU), a :class:`~llamafleet.fleet.messages.Pulse` from a thread beside the engine's
(:mod:`llamafleet.fleet.worker`). A worker that is alive is therefore never silent for much more than ``beat_s``,
however slow its steps are; one that sends nothing at all is frozen whole (SIGSTOP, a paused VM, a host swapping
hard) or cut off. A step can still take longer than expected without the worker being frozen (the process starved of
CPU for a moment), so the bound also scales with the worker's own pace.

:class:`Silence` watches one worker. It is *suspect* once silent for longer than its bound: :data:`STEP_FACTOR` (5)
times the p99 of its recent step times, and never less than ``suspect_after_s`` (2 s by default). It stops being
suspect the moment anything arrives from it. What a suspect replica means for routing (no new sequences while another
replica can take them; its sequences that have not started moved elsewhere) is the dispatcher's business; killing a
worker that stays silent for ``heartbeat_timeout_s`` stays :mod:`llamafleet.fleet.replicas`'s, on the engine loop's
messages alone (a pulse does not count there: a wedged step is hung however alive its process is).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from llamafleet.engine.types import EngineStats

STEP_FACTOR = 5.0  # a step this many times longer than the recent p99 is not expected
STEP_SAMPLES = 256  # recent step times kept per worker
SUSPECT_AFTER_S = 2.0  # the default of the floor, ``suspect_after_s``


def p99(values: list[float]) -> float:
    """The 99th percentile (nearest rank) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


@dataclass
class Silence:
    """How long one worker has said nothing, and whether that is too long (see the module docstring)."""

    floor_s: float  # suspect_after_s
    heard_at: float  # time.monotonic() of its last message of any kind
    suspect_since: float | None = None  # heard_at when it became suspect
    _steps: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_SAMPLES))
    _seen: tuple[int, float] = (0, 0.0)  # (steps, step seconds) of its engine at its last step outputs

    @property
    def suspect(self) -> bool:
        return self.suspect_since is not None

    def heard(self, now: float) -> float | None:
        """It sent something at ``now``; returns how long it had been silent when that ends a suspicion."""
        silent, self.heard_at = now - self.heard_at, now
        if self.suspect_since is None:
            return None
        self.suspect_since = None
        return silent

    def stepped(self, stats: EngineStats) -> None:
        """Its step outputs carried ``stats``: record the mean time of the steps since the last ones."""
        steps, seconds = stats.steps - self._seen[0], stats.step_seconds_total - self._seen[1]
        if steps > 0:
            self._steps.append(seconds / steps)
        self._seen = (stats.steps, stats.step_seconds_total)

    def bound(self) -> float:
        """The silence past which it is suspect."""
        return max(self.floor_s, STEP_FACTOR * p99(list(self._steps)))

    def check(self, now: float) -> tuple[float, float] | None:
        """(silence, bound) if it became suspect now; None if it is not, or already was."""
        silent = now - self.heard_at
        if self.suspect_since is not None or silent <= self.floor_s:
            return None
        bound = self.bound()
        if silent <= bound:
            return None
        self.suspect_since = self.heard_at
        return silent, bound

    def describe(self) -> str:
        """The bound in words, for the log line."""
        recent = p99(list(self._steps))
        return (f"{STEP_FACTOR:g} x its recent p99 step of {recent:.3f}s, at least suspect_after_s "
                f"{self.floor_s:g}s")
