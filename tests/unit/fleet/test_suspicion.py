"""When a silent worker becomes suspect: past the floor, and past five times its own recent p99 step."""

from __future__ import annotations

from llamafleet.engine.types import EngineStats
from llamafleet.fleet.suspicion import STEP_FACTOR, Silence, p99


def _stats(steps: int, seconds: float) -> EngineStats:
    return EngineStats(slots_total=1, slots_busy=1, waiting=0, kv_tokens_used=0, kv_tokens_total=0, steps=steps,
                       prompt_tokens_total=0, generated_tokens_total=0, decode_seconds_total=0.0,
                       step_seconds_total=seconds, sample_seconds_total=0.0)


def test_p99_is_the_nearest_rank() -> None:
    assert p99([]) == 0.0
    assert p99([3.0]) == 3.0
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([1.0] * 98 + [7.0, 9.0]) == 7.0  # one outlier in a hundred is above it


def test_fast_steps_leave_the_floor_as_the_bound() -> None:
    s = Silence(2.0, heard_at=100.0)
    s.stepped(_stats(10, 0.1))  # 10 ms a step
    assert s.bound() == 2.0
    assert s.check(101.9) is None and s.check(102.0) is None
    assert s.check(102.5) == (2.5, 2.0) and s.suspect
    assert s.check(103.0) is None  # once: it already is
    assert s.heard(104.0) == 4.0 and not s.suspect  # it spoke: back, and how long it was silent
    assert s.heard(104.5) is None


def test_slow_steps_raise_the_bound_to_five_times_their_p99() -> None:
    s = Silence(2.0, heard_at=0.0)
    seen = 0.0
    for steps in range(1, 51):  # one step of 0.8 s per message
        seen += 0.8
        s.stepped(_stats(steps, seen))
    assert abs(s.bound() - STEP_FACTOR * 0.8) < 1e-9
    assert s.check(3.9) is None  # past the floor, within its own pace
    found = s.check(4.1)
    assert found is not None and abs(found[1] - 4.0) < 1e-9
    assert "p99 step of 0.800s" in s.describe() and "suspect_after_s 2" in s.describe()


def test_a_message_covering_several_steps_counts_their_mean() -> None:
    s = Silence(0.1, heard_at=0.0)
    s.stepped(_stats(4, 2.0))  # 4 steps since the start, 2 s in all
    s.stepped(_stats(4, 2.0))  # no step since: nothing to learn
    assert abs(s.bound() - STEP_FACTOR * 0.5) < 1e-9
