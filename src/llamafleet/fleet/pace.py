"""Whether the replicas run as fast as they can: each replica's engine steps against its own recent best, and the
host's load against its cores.

A busy CPU slows llama.cpp more than its share: its threads wait for each other at every operation, so one core
taken by another process stalls them all (docs/BENCHMARKS.md, "Threads on a busy CPU"). Nothing else would say so:
``/ready`` stays ``ready`` and the numbers only look slow. :class:`Pace` is fed the replicas' engine stats about
once a second (the dashboard's sampler) and keeps, per replica, the seconds per step of the intervals that only
decoded (no prompt was computed: those steps take as long as their prompt chunks), grouped by how many answers each
step carried. An interval whose steps take :data:`SLOW_FACTOR` times the best of the last :data:`WINDOW_S` for the
same width counts as slow; :data:`HOLD` slow intervals in a row raise a warning, as many normal ones clear it.
The host is overloaded while its 1-minute load average exceeds its cores (until it is :data:`LOAD_MARGIN` under).
Each warning is logged once when it starts and once when it ends, and :meth:`Pace.warnings` lists those in force
(``GET /v1/status``'s ``warnings``, the dashboard's banner).
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from llamafleet.engine.cores import host_cores
from llamafleet.engine.types import EngineStats

log = logging.getLogger(__name__)

SLOW_FACTOR = 3.0  # steps this many times slower than the replica's best for the same width are slow
WINDOW_S = 600.0  # the best is the best of the last ten minutes
HOLD = 5  # intervals in a row that raise (or clear) a warning
MIN_STEPS = 3  # an interval with fewer steps says too little
LOAD_MARGIN = 0.5  # the load warning ends once the load is this far under the cores (no flapping at the line)


def load_average() -> float:
    """The host's 1-minute load average (runnable and waiting processes)."""
    return os.getloadavg()[0]


@dataclass
class _Replica:
    """One replica's last totals, its recent step times by width, and its slow streak."""

    pid: int | None
    stats: EngineStats
    best: dict[int, collections.deque[tuple[float, float]]] = field(default_factory=dict)  # width -> (t, s/step)
    streak: int = 0  # slow intervals in a row (> 0) or normal ones (< 0)
    slow: str | None = None  # the warning in force


class Pace:
    """See the module docstring; :meth:`observe` about once a second, :meth:`warnings` when asked."""

    def __init__(self, cores: int | None = None, load: Callable[[], float] = load_average) -> None:
        self.cores = cores or host_cores()
        self._load = load
        self._replicas: dict[str, _Replica] = {}
        self._overloaded: str | None = None

    def observe(self, replicas: Iterable[tuple[str, int | None, EngineStats | None]], now: float) -> None:
        """Record each replica's ``(label, worker pid, engine stats)`` at ``now`` (monotonic seconds)."""
        seen = set()
        for label, pid, stats in replicas:
            if stats is None:
                continue
            seen.add(label)
            before = self._replicas.get(label)
            if before is None or before.pid != pid:  # new, or a restarted worker: its totals start again
                self._replicas[label] = _Replica(pid, stats)
                continue
            self._interval(label, before, stats, now)
            before.stats = stats
        for label in set(self._replicas) - seen:  # unloaded: its warning goes with it
            if self._replicas.pop(label).slow:
                log.info("replica %s is gone; its slow-steps warning with it", label)
        self._check_load()

    def warnings(self) -> list[str]:
        """The warnings in force, the host's first."""
        found = [self._overloaded] if self._overloaded else []
        return found + [r.slow for _, r in sorted(self._replicas.items()) if r.slow]

    def _interval(self, label: str, rep: _Replica, stats: EngineStats, now: float) -> None:
        old = rep.stats
        steps = stats.steps - old.steps
        if steps < MIN_STEPS or stats.prompt_tokens_total != old.prompt_tokens_total:
            return  # idle, or steps that also computed prompts: no measure of the decode speed
        per_step = (stats.step_seconds_total - old.step_seconds_total) / steps
        width = max(1, round((stats.generated_tokens_total - old.generated_tokens_total) / steps))
        times = rep.best.setdefault(width, collections.deque())
        while times and times[0][0] < now - WINDOW_S:
            times.popleft()
        best = min((s for _, s in times), default=None)
        times.append((now, per_step))
        slow = best is not None and per_step > SLOW_FACTOR * best
        rep.streak = (max(rep.streak, 0) + 1) if slow else (min(rep.streak, 0) - 1)
        if slow and rep.streak >= HOLD and rep.slow is None:
            assert best is not None
            rep.slow = (f"replica {label}: its steps take {per_step * 1000:.0f} ms, {per_step / best:.1f}x its best "
                        f"of the last {WINDOW_S / 60:.0f} minutes ({best * 1000:.0f} ms) for {width} answer(s) at "
                        "once: the machine is busier than it was (another process on its CPU or GPU?)")
            log.warning("%s", rep.slow)
        elif not slow and rep.streak <= -HOLD and rep.slow is not None:
            rep.slow = None
            log.info("replica %s: its steps are back to their usual speed", label)

    def _check_load(self) -> None:
        load = self._load()
        if load > self.cores and self._overloaded is None:
            self._overloaded = (f"the host's load ({load:.1f}, 1-minute average) exceeds its {self.cores} cores: "
                                "processes wait for a CPU, and llama.cpp's threads, which wait for each other, slow "
                                "down the most; stop the other work, or lower threads")
            log.warning("%s", self._overloaded)
        elif load <= self.cores - LOAD_MARGIN and self._overloaded is not None:
            self._overloaded = None
            log.info("the host's load (%.1f) is within its %d cores again", load, self.cores)
