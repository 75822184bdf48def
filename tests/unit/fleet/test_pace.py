"""Slow steps and a busy host are said (``fleet/pace.py``): a replica's decode steps against its own recent best,
the host's load against its cores; each warning logged once when it starts and once when it ends."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import pytest

from llamafleet.engine.cores import default_threads, host_cores
from llamafleet.engine.types import EngineStats
from llamafleet.fleet.pace import HOLD, Pace


@dataclass
class Replica:
    """A worker's running totals, advanced one second at a time."""

    stats: EngineStats = EngineStats(slots_total=4, slots_busy=0, waiting=0, kv_tokens_used=0, kv_tokens_total=1024,
                                     steps=0, prompt_tokens_total=0, generated_tokens_total=0,
                                     decode_seconds_total=0.0, step_seconds_total=0.0, sample_seconds_total=0.0)

    def second(self, steps: int, step_s: float, width: int = 2, prompt: int = 0) -> EngineStats:
        s = self.stats
        self.stats = replace(s, steps=s.steps + steps, step_seconds_total=s.step_seconds_total + steps * step_s,
                             generated_tokens_total=s.generated_tokens_total + steps * width,
                             prompt_tokens_total=s.prompt_tokens_total + prompt)
        return self.stats


def run(pace: Pace, rep: Replica, seconds: int, t0: float, **second: float) -> float:
    for i in range(seconds):
        pace.observe([("0", 100, rep.second(**second))], t0 + i)  # type: ignore[arg-type]
    return t0 + seconds


def test_steps_much_slower_than_the_replicas_best_warn_once_and_clear(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "llamafleet.fleet.pace")
    pace, rep = Pace(cores=8, load=lambda: 1.0), Replica()
    t = run(pace, rep, 10, 0.0, steps=50, step_s=0.02)
    assert pace.warnings() == []
    t = run(pace, rep, HOLD - 1, t, steps=10, step_s=0.1)  # 5x slower, but not long enough yet
    assert pace.warnings() == []
    t = run(pace, rep, 3, t, steps=10, step_s=0.1)
    (warning,) = pace.warnings()
    assert warning.startswith("replica 0: its steps take 100 ms, 5.0x its best")
    assert "(20 ms) for 2 answer(s)" in warning
    t = run(pace, rep, HOLD, t, steps=50, step_s=0.021)
    assert pace.warnings() == []
    assert [r.getMessage()[:20] for r in caplog.records] == ["replica 0: its steps", "replica 0: its steps"]
    assert caplog.records[0].levelname == "WARNING" and "back to their usual speed" in caplog.records[1].getMessage()


def test_what_is_not_a_slow_decode_is_not_compared() -> None:
    pace, rep = Pace(cores=8, load=lambda: 1.0), Replica()
    t = run(pace, rep, 10, 0.0, steps=50, step_s=0.02, width=1)
    t = run(pace, rep, 10, t, steps=10, step_s=0.5, width=1, prompt=512)  # prompt chunks make long steps
    t = run(pace, rep, 10, t, steps=10, step_s=0.1, width=16)  # 16 answers a step: no best of that width yet
    t = run(pace, rep, 10, t, steps=2, step_s=1.0, width=1)  # too few steps to tell
    assert pace.warnings() == []
    pace.observe([("0", 101, Replica().second(steps=50, step_s=0.5))], t)  # a restarted worker starts afresh
    assert pace.warnings() == []


def test_an_overloaded_host_is_said_until_its_load_is_well_under_its_cores() -> None:
    load = [1.0]
    pace = Pace(cores=2, load=lambda: load[0])
    pace.observe([], 0.0)
    assert pace.warnings() == []
    load[0] = 3.4
    pace.observe([], 1.0)
    (warning,) = pace.warnings()
    assert warning.startswith("the host's load (3.4, 1-minute average) exceeds its 2 cores")
    load[0] = 1.8  # under, but at the line: no flapping
    pace.observe([], 2.0)
    assert pace.warnings() == [warning]
    load[0] = 1.2
    pace.observe([], 3.0)
    assert pace.warnings() == []


def test_threads_default_to_every_core_but_one_shared_by_a_cpu_plans_replicas() -> None:
    cores = host_cores()
    assert default_threads() == max(1, cores - 1)
    assert default_threads(2) == max(1, (cores - 1) // 2)
    assert default_threads(cores * 4) == 1
