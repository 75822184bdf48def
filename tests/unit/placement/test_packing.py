"""Several models on one machine (placement/packing.py): the resident set, swaps, and what a load evicts, on a
described 2 x 24 GB machine with sparse 7B/13B/70B models, and on a CPU with a described amount of RAM."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from test_planner import inventory

from llamafleet.config import FleetConfig
from llamafleet.model.header import ModelInfo
from llamafleet.placement.gpus import Inventory
from llamafleet.placement.packing import (
    HOST,
    Demand,
    Placed,
    device_use,
    evictions,
    pack,
    residual,
    swaps,
    usage,
)
from llamafleet.placement.planner import make_plan
from synth_models import sparse_models

TWO = inventory("2x24gb-pcie")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelInfo]:
    return sparse_models(tmp_path_factory)


def demand(models: dict[str, ModelInfo], name: str, model: str, pinned: bool = False, **cfg: Any) -> Demand:
    return Demand(name, models[model], FleetConfig(**{"replicas": 1, "parallel": 1, **cfg}), pinned)


def fleet(models: dict[str, ModelInfo]) -> list[Demand]:
    """chat (13B Q8_0, pinned) fills most of GPU 0; coder (7B F16) most of GPU 1; small fits beside coder; wide
    (7B Q4_0 with 6 slots) fits only where coder or chat is."""
    return [demand(models, "chat", "13b-q8_0", pinned=True), demand(models, "coder", "7b-f16"),
            demand(models, "small", "7b-q4_0", context_length=2048), demand(models, "wide", "7b-q4_0", parallel=6)]


def test_pinned_first_then_config_order_and_the_rest_swaps(models: dict[str, ModelInfo]) -> None:
    packing, fixed = pack(fleet(models), TWO)
    assert packing.fits and packing.reasons == ()
    assert [(p.name, dict(p.usage)) for p in packing.resident] == [
        ("chat", {0: 17373}), ("coder", {1: 15777}), ("small", {1: 5693})]  # each with its process's margin
    assert packing.swapped == ("wide",)
    assert [d.cfg.parallel for d in fixed] == [1, 1, 1, 6]
    rows = {d.device: d for d in device_use(packing, TWO, 1024)}
    assert rows["GPU 1"].models == {"coder": 15777, "small": 5693}
    assert rows["GPU 1"].left_mib == 24100 - 15777 - 5693 and rows["GPU 0"].left_mib == 24100 - 17373
    # loading wide right after start evicts the least recently used unpinned model: coder (started first)
    assert swaps(packing, fixed, TWO)["wide"].evict == ("coder",)


def test_pinned_order_is_kept_whatever_the_list_order(models: dict[str, ModelInfo]) -> None:
    packing, _ = pack(list(reversed(fleet(models))), TWO)
    assert packing.resident[0].name == "chat" and packing.resident[0].usage == {0: 17373}


def test_evictions_follow_lru_and_stop_when_it_fits(models: dict[str, ModelInfo]) -> None:
    packing, fixed = pack(fleet(models), TWO)
    wide = fixed[3]
    loaded = packing.resident
    first = evictions(wide, TWO, loaded, ["coder", "small"], {"chat"})
    assert first.evict == ("coder",) and first.plan is not None and first.plan.replicas[0].gpus == (1,)
    # small was used least recently: it goes first, but wide still does not fit beside coder, so coder goes too
    both = evictions(wide, TWO, loaded, ["small", "coder"], {"chat"})
    assert both.evict == ("small", "coder")
    free = residual(TWO, [p for p in loaded if p.name == "chat"])
    assert make_plan(wide.model, free, wide.cfg).fits
    # nothing to evict when it fits already
    small_only = [p for p in loaded if p.name != "coder"]
    assert evictions(wide, TWO, small_only, ["small"], {"chat"}).evict == ()


def test_a_model_in_use_or_loading_makes_a_load_wait(models: dict[str, ModelInfo]) -> None:
    packing, fixed = pack(fleet(models), TWO)
    wait = evictions(fixed[3], TWO, packing.resident, ["small"], {"chat"})  # coder is not evictable now
    assert wait.plan is None and not wait.never and "until coder" in wait.reason


def test_a_model_that_never_fits_beside_the_pinned_ones_is_refused(models: dict[str, ModelInfo]) -> None:
    big = Demand("big", models["70b-q4_0"], FleetConfig(replicas=1), False)  # slots and context fitted
    packing, fixed = pack([demand(models, "chat", "13b-q8_0", pinned=True), big], TWO)
    assert not packing.fits and packing.resident[0].name == "chat"
    (reason,) = packing.reasons
    assert reason.startswith("big does not fit this machine beside the pinned models (chat): ")
    assert "even the floors" in reason  # the planner's own reasons follow
    never = evictions(fixed[1], TWO, packing.resident, [], {"chat"})
    assert never.never and "beside the pinned models (chat)" in never.reason
    # unpinned, the same model's shape is fitted to the whole machine, and it can load by evicting chat
    packing, fixed = pack([demand(models, "chat", "13b-q8_0"), big], TWO)
    assert packing.fits and packing.swapped == ("big",) and fixed[1].cfg.parallel == 6
    assert evictions(fixed[1], TWO, packing.resident, ["chat"]).evict == ("chat",)


def test_pinned_models_that_do_not_fit_together_are_refused(models: dict[str, ModelInfo]) -> None:
    packing, _ = pack([demand(models, "a", "13b-f16", pinned=True), demand(models, "b", "13b-f16", pinned=True)],
                      TWO)
    assert not packing.fits and [p.name for p in packing.resident] == ["a"]
    assert packing.reasons[0].startswith("b does not fit this machine beside the pinned models (a)")


def test_on_the_cpu_ram_is_the_budget(models: dict[str, ModelInfo]) -> None:
    cpu = Inventory((), (), "none", note="test: CPU", host_mem_mib=16000)
    ds = [demand(models, "a", "7b-q4_0", context_length=2048), demand(models, "b", "7b-q8_0", context_length=2048),
          demand(models, "c", "7b-q4_0", context_length=2048)]
    packing, fixed = pack(ds, cpu)
    assert [p.name for p in packing.resident] == ["a", "b"] and packing.swapped == ("c",)
    assert all(set(p.usage) == {HOST} for p in packing.resident)
    assert [d.device for d in device_use(packing, cpu, 1024)] == ["CPU"]
    assert evictions(fixed[2], cpu, packing.resident, ["b", "a"]).evict == ("b",)
    unknown = Inventory((), (), "none")  # RAM not known: nothing is checked, nothing swaps
    assert pack(ds, unknown)[0].swapped == ()


def test_usage_counts_each_gpu_of_a_split_replica(models: dict[str, ModelInfo]) -> None:
    plan = make_plan(models["13b-f16"], TWO, FleetConfig(parallel=1))
    assert plan.fits and plan.replicas[0].gpus == (0, 1)
    used = usage(plan)
    # each GPU also keeps the margin for the replica's process there (its CUDA context)
    assert set(used) == {0, 1} and sum(used.values()) == sum(b.used_mib for b in plan.budgets)
    left = residual(TWO, [Placed("x", plan, used)])
    assert [g.free_mib for g in left.gpus] == [24100 - used[0], 24100 - used[1]]


def test_each_model_on_a_gpu_keeps_the_margin_for_its_own_process(models: dict[str, ModelInfo]) -> None:
    """Two models on one GPU are two worker processes, each with its own CUDA context, cuBLAS workspace and memory
    pool (1,136 MiB beside a 7B Q4_0's parts on an H200): the margin that covers them is kept for each."""
    a, b = (demand(models, name, "7b-q4_0", context_length=2048) for name in ("a", "b"))
    alone = make_plan(a.model, TWO, a.cfg).budgets[0]
    parts = alone.used_mib - alone.margin_mib

    def one_gpu(free_mib: int) -> Inventory:
        return replace(TWO, gpus=(replace(TWO.gpus[0], free_mib=free_mib),), links=(("self",),))

    packing, _ = pack([a, b], one_gpu(2 * parts + 1024 + 512))  # both models' parts, one margin and a half
    assert [p.name for p in packing.resident] == ["a"] and packing.swapped == ("b",)
    assert [p.name for p in pack([a, b], one_gpu(2 * parts + 2 * 1024))[0].resident] == ["a", "b"]
