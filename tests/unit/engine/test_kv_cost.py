"""When a KV tier's copies pay (engine/kv_cost.py): the rules on measured rates, and one step's copy budget."""

from __future__ import annotations

from llamafleet.engine.kv_cost import CopyCosts, Rate, StepBudget


def costs(prefill: float | None, save: float | None, restore: float | None = None) -> CopyCosts:
    """Rates in seconds per token, each as one measurement of 1,000 tokens."""
    c = CopyCosts()
    for rate, v in ((c.prefill, prefill), (c.save, save), (c.restore["ram"], restore)):
        if v is not None:
            rate.add(v * 1000, 1000)
    return c


def test_a_rate_is_an_average_leaning_to_the_newest_and_ignores_empty_measurements() -> None:
    r = Rate()
    r.add(1.0, 0)
    assert r.per_token is None
    r.add(2.0, 1000)
    assert r.per_token == 0.002
    r.add(4.0, 1000)
    assert 0.002 < r.per_token < 0.004


def test_unmeasured_rates_say_copy_so_that_the_copy_measures_them() -> None:
    assert costs(None, None).worth_saving() and costs(0.01, None).worth_saving()
    assert costs(None, None).worth_restoring("ram", 1000, 10) and costs(0.01, None).worth_restoring("disk", 1000, 10)


def test_on_a_cpu_copies_are_far_cheaper_than_prefilling() -> None:
    cpu = costs(prefill=11e-3, save=19e-6, restore=3e-6)  # the demo model on CPU (docs/BENCHMARKS.md)
    assert cpu.worth_saving()
    assert cpu.worth_restoring("ram", 900, 900)
    assert not cpu.worth_restoring("ram", 900, 0)  # nothing gained over the slot: never worth a copy


def test_on_a_fast_gpu_a_save_costs_more_than_prefilling_again() -> None:
    h200 = costs(prefill=95e-6, save=357e-6, restore=64e-6)  # a 7B model on an H200 (run 12)
    assert not h200.worth_saving()
    assert h200.worth_restoring("ram", 4200, 4200)  # a state already held is still cheaper to restore
    assert not h200.worth_restoring("ram", 4200, 1000)  # but not to gain a quarter of it
    h200.restore["disk"].add(7.5, 4200)  # from disk: 1.8 ms a token
    assert not h200.worth_restoring("disk", 4200, 4200)


def test_a_step_allows_its_first_copy_then_stops_once_a_pass_worth_is_spent() -> None:
    b = StepBudget(None)
    b.last_pass_s = 0.05
    b.new_step()
    assert not b.spent_out()  # nothing copied yet
    b.add(0.01)
    assert not b.spent_out()
    b.add(0.05)
    assert b.spent_out() and b.deferrals == 1
    b.new_step()
    assert not b.spent_out()
    b.add(2.0)  # one copy longer than the whole budget: allowed, as the step's first
    assert b.spent_out() and b.deferrals == 2


def test_a_fixed_budget_of_zero_allows_one_copy_per_step() -> None:
    b = StepBudget(0.0)
    b.last_pass_s = 10.0
    b.new_step()
    b.add(0.0)
    assert b.spent_out()
