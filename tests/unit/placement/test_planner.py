"""The planner over the issue's machines and models: chosen mode, ratios, fit or refusal (with numbers), and the
explicit YAML choices it honours but checks."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llamafleet.cli import main
from llamafleet.config import FleetConfig, load_config
from llamafleet.model.header import ModelInfo
from llamafleet.placement.autofit import auto_shapes
from llamafleet.placement.gpus import Inventory, load_inventory
from llamafleet.placement.planner import Plan, launch_spec, make_plan
from synth_models import sparse_models

ROOT = Path(__file__).resolve().parents[3]
INVENTORIES = ("1x24gb", "2x24gb-pcie", "2x141gb-nvlink", "4x80gb-nvlink", "80gb-24gb-mixed", "24gb-12gb-mixed")
# 8 slots x 4096 tokens set explicitly (the defaults), f16 KV, 1 GiB margin. "!" = refused; replicas as "gpus/mode".
DP2, DP4 = "0/none 1/none", "0/none 1/none 2/none 3/none"
EXPECTED = {
    "7b-q4_0": ["0/none", DP2, DP2, DP4, DP2, "0/none"],
    "7b-q8_0": ["!0/none", "0,1/layer", DP2, DP4, "0/none", "0,1/layer"],
    "7b-f16": ["!0/none", "0,1/layer", DP2, DP4, "0/none", "0,1/layer"],
    "13b-q4_0": ["!0/none", "0,1/layer", DP2, DP4, "0/none", "0,1/layer"],
    "13b-q8_0": ["!0/none", "0,1/layer", DP2, DP4, "0/none", "!0,1/layer"],
    "13b-f16": ["!0/none", "!0,1/layer", DP2, DP4, "0/none", "!0,1/layer"],
    "70b-q4_0": ["!0/none", "!0,1/layer", DP2, DP4, "0/none", "!0,1/layer"],
    "70b-q8_0": ["!0/none", "!0,1/layer", DP2, "0,1/tensor 2,3/tensor", "0/none", "!0,1/layer"],
    "70b-f16": ["!0/none", "!0,1/layer", DP2, "0,1/tensor 2,3/tensor", "!0,1/layer", "!0,1/layer"],
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelInfo]:
    return sparse_models(tmp_path_factory)


def inventory(name: str) -> Inventory:
    return load_inventory(ROOT / "examples" / "inventories" / f"{name}.yaml")


def layout(plan: Plan) -> str:
    text = " ".join(f"{','.join(map(str, r.gpus))}/{r.split_mode}" for r in plan.replicas)
    return text if plan.fits else "!" + text


def plan_for(models: dict[str, ModelInfo], model: str, inv: str, **cfg: Any) -> Plan:
    return make_plan(models[model], inventory(inv), FleetConfig(**cfg))


@pytest.mark.parametrize("model", sorted(EXPECTED))
@pytest.mark.parametrize("inv", INVENTORIES)
def test_issue_matrix(models: dict[str, ModelInfo], model: str, inv: str) -> None:
    plan = make_plan(models[model], inventory(inv), FleetConfig(parallel=8, context_length=4096))
    assert layout(plan) == EXPECTED[model][INVENTORIES.index(inv)], plan.reasons
    assert plan.device == "gpu" and plan.n_seq == 8 and plan.n_ctx_per_seq == 4096
    gpus = {g.index: g for g in inventory(inv).gpus}
    for r in plan.replicas:
        if len(r.gpus) == 1:
            assert r.tensor_split == () and r.main_gpu == r.gpus[0]
            continue
        assert sum(r.tensor_split) == pytest.approx(1.0, abs=1e-3)
        free = [gpus[i].free_mib - 1024 for i in r.gpus]  # ratios follow what each GPU can hold
        if plan.fits:
            assert r.tensor_split[0] / r.tensor_split[1] == pytest.approx(free[0] / free[1], rel=0.12)
    if plan.fits:
        assert all(b.used_mib <= (b.capacity_mib or 0) for b in plan.budgets)
        assert any("one per GPU" in x or "split over GPUs" in x for x in plan.reasons)
    else:  # refusals say by how much, and what would make it fit
        assert any("overflows by" in x and "MiB" in x for x in plan.reasons), plan.reasons
        assert any(x.startswith(("lower context_length", "a Q4_0 file", "or about")) for x in plan.reasons)


# The same machines with parallel and context_length unset: auto-fit takes the most that fit, from 8 x 4096 down
# to 1 slot, then down to 2048 tokens; "!" = refused even at those floors. "slots x tokens:gpus/mode ...".
AUTO = {
    "7b-q8_0": ["7x4096:0/none", "8x4096:0,1/layer", "8x4096:0/none 1/none"],
    "13b-q4_0": ["5x4096:0/none", "8x4096:0,1/layer", "8x4096:0/none 1/none"],
    "13b-f16": ["!1x2048:0/none", "6x4096:0,1/layer", "8x4096:0/none 1/none"],
    "70b-q4_0": ["!1x2048:0/none", "6x4096:0,1/layer", "8x4096:0/none 1/none"],
    "70b-f16": ["!1x2048:0/none", "!1x2048:0,1/layer", "8x4096:0/none 1/none"],
}


@pytest.mark.parametrize("model", sorted(AUTO))
def test_auto_fit_matrix(models: dict[str, ModelInfo], model: str) -> None:
    for inv, expected in zip(INVENTORIES, AUTO[model], strict=False):
        plan = make_plan(models[model], inventory(inv), FleetConfig())
        assert f"{plan.n_seq}x{plan.n_ctx_per_seq}:{layout(plan).lstrip('!')}" == expected.lstrip("!"), inv
        assert plan.fits == (not expected.startswith("!")), (inv, plan.reasons)
        note = plan.reasons[1]
        assert note.startswith("parallel and context_length not set: "), note
        if not plan.fits:  # refused at the floors: said, with the usual reasons and fixes
            assert "even the floors (1 slot(s) x 2048 tokens) do not fit" in note
            assert any("overflows by" in x for x in plan.reasons)
        elif plan.n_seq < 8:
            assert f"{plan.n_seq} slot(s) x 4096 tokens, the most that fit (8 x 4096 does not)" in note


def test_issue_70b_q4_0_on_two_24gb_cards_fits_with_fewer_slots(models: dict[str, ModelInfo]) -> None:
    """Issue 16: refused at the default 8 x 4096 although fewer slots of 4096 fit; unset knobs are now fitted."""
    assert not plan_for(models, "70b-q4_0", "2x24gb-pcie", parallel=8, context_length=4096).fits
    plan = plan_for(models, "70b-q4_0", "2x24gb-pcie")
    assert plan.fits and layout(plan) == "0,1/layer" and plan.n_ctx_per_seq == 4096 and 1 <= plan.n_seq < 8
    assert all(b.overflow_mib == 0 for b in plan.budgets)
    assert not plan_for(models, "70b-q4_0", "2x24gb-pcie", parallel=plan.n_seq + 1, context_length=4096).fits
    assert any(f"{plan.n_seq} slot(s) x 4096 tokens, the most that fit" in x for x in plan.reasons)
    cli = load_config(None, {"context_length": 4096})  # a flag sets only what it names: parallel stays fitted
    assert make_plan(models["70b-q4_0"], inventory("2x24gb-pcie"), cli).n_seq == plan.n_seq


def test_auto_fit_touches_only_unset_knobs(models: dict[str, ModelInfo]) -> None:
    # parallel set: only the context is fitted, in steps of 256, down to its floor
    ctx_only = plan_for(models, "70b-q4_0", "2x24gb-pcie", parallel=8)
    assert ctx_only.fits and (ctx_only.n_seq, ctx_only.n_ctx_per_seq) == (8, 3328)
    assert ctx_only.reasons[1].startswith("context_length not set: 8 slot(s) x 3328 tokens, the most that fit")
    floor = plan_for(models, "13b-f16", "1x24gb", parallel=8)
    assert not floor.fits and (floor.n_seq, floor.n_ctx_per_seq) == (8, 2048)
    assert "context_length not set: even the floors (8 slot(s) x 2048 tokens) do not fit" in floor.reasons[1]
    both_set = plan_for(models, "70b-q4_0", "2x24gb-pcie", parallel=8, context_length=4096)
    assert not any("not set" in x for x in both_set.reasons)
    # context set: only the slots are fitted; a set value is never changed, even one equal to the default
    slots_only = plan_for(models, "13b-f16", "2x24gb-pcie", context_length=4096)
    assert slots_only.fits and (slots_only.n_seq, slots_only.n_ctx_per_seq) == (6, 4096)
    assert slots_only.reasons[1].startswith("parallel not set: 6 slot(s)")
    # on the CPU, RAM is the budget: 8 slots of 4096 (16 GiB of KV) do not fit 8000 MiB, fewer do
    cpu = make_plan(models["7b-q4_0"], Inventory((), (), "none", host_mem_mib=8000), FleetConfig())
    assert cpu.fits and cpu.device == "cpu" and (cpu.n_seq, cpu.n_ctx_per_seq) == (1, 4096)
    # a rule that refuses (quantized KV without flash attention) is not retried at smaller sizes
    ruled = plan_for(models, "7b-q4_0", "1x24gb", kv_cache_type="q8_0", flash_attn=False)
    assert not ruled.fits and "no size helps" in ruled.reasons[1] and ruled.n_seq == 8


def test_auto_context_stops_at_the_trained_context(models: dict[str, ModelInfo]) -> None:
    short = replace(models["7b-q4_0"], n_ctx_train=1000)  # trained on fewer tokens than the default and the floor
    plan = make_plan(short, inventory("1x24gb"), FleetConfig())
    assert plan.fits and plan.n_ctx_per_seq == 768 and not any("exceeds" in w for w in plan.warnings)
    assert auto_shapes(short, FleetConfig(), {"context_length"}) == [(8, 768)]
    assert auto_shapes(models["7b-q4_0"], FleetConfig(parallel=2), {"context_length"}) == [
        (2, 4096), (2, 3840), (2, 3584), (2, 3328), (2, 3072), (2, 2816), (2, 2560), (2, 2304), (2, 2048)]
    set_long = plan_for(models, "7b-q4_0", "2x141gb-nvlink", context_length=8192)
    assert set_long.n_ctx_per_seq == 8192  # a set context is kept (and warned about), not capped


def test_budget_adds_up_on_one_gpu(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "7b-q4_0", "1x24gb")
    (b,) = plan.budgets
    m = models["7b-q4_0"]
    assert b.kv_mib == 16384  # 32 layers x 32 KV heads x 128 x 2 x 2 bytes x 8 x 4096 tokens
    assert b.weights_mib * 2**20 == pytest.approx(m.weights_bytes - m.input_bytes, abs=2**20)
    assert 50 < b.compute_mib < 200 and b.margin_mib == 1024
    assert b.used_mib == b.weights_mib + b.kv_mib + b.compute_mib + b.margin_mib
    assert plan.host_mib >= m.input_bytes // 2**20  # the token embedding stays in host memory


def test_mixed_80_24_splits_about_3_to_1(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "70b-q8_0", "80gb-24gb-mixed", parallel=16)
    (r,) = plan.replicas
    assert plan.fits and r.split_mode == "layer" and r.gpus == (0, 1)
    assert 3.0 < r.tensor_split[0] / r.tensor_split[1] < 3.9
    assert all(b.capacity_mib - b.used_mib < 0.25 * b.capacity_mib for b in plan.budgets)  # both well used


def test_seed_even_ratio_on_80_24_names_the_overflowing_gpu(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "70b-q8_0", "80gb-24gb-mixed", parallel=16, split_ratio=[0.5, 0.5])
    assert not plan.fits and plan.replicas[0].tensor_split == (0.5, 0.5)
    over = [b for b in plan.budgets if b.overflow_mib]
    assert [b.device for b in over] == ["GPU 1"]
    assert any(f"GPU 1 overflows by {over[0].overflow_mib} MiB" in x for x in plan.reasons)
    assert any("lopsided" in w and "GPU 1 to" in w for w in plan.warnings)


def test_seed_config_on_24_12_is_refused_and_flagged(models: dict[str, ModelInfo]) -> None:
    # the seed's file (13B Q8_0, split_ratio [0.5, 0.5]) at 8 slots; with parallel unset, auto-fit takes fewer
    cfg = load_config(ROOT / "examples" / "fleet.yaml", {"parallel": 8})
    plan = make_plan(models["13b-q8_0"], inventory("24gb-12gb-mixed"), cfg)
    assert not plan.fits and layout(plan) == "!0,1/layer" and plan.replicas[0].main_gpu == 0
    assert any("GPU 1 overflows by" in x for x in plan.reasons)
    assert not any("GPU 0 overflows" in x for x in plan.reasons)
    warning = next(w for w in plan.warnings if "lopsided" in w)
    assert "split_ratio [0.5, 0.5]" in warning and "[0.68, 0.32]" in warning
    assert any("not split_ratio" in x for x in plan.reasons)  # the advice assumes balanced ratios, and says so


def test_seed_ratio_that_fits_is_still_flagged(models: dict[str, ModelInfo]) -> None:
    cfg = load_config(ROOT / "examples" / "fleet.yaml", {"parallel": 1})
    plan = make_plan(models["13b-q8_0"], inventory("24gb-12gb-mixed"), cfg)
    assert plan.fits and plan.replicas[0].tensor_split == (0.5, 0.5)
    assert any("lopsided" in w for w in plan.warnings)
    balanced = make_plan(models["13b-q8_0"], inventory("24gb-12gb-mixed"), FleetConfig(parallel=1))
    assert balanced.replicas[0].split_mode == "none"  # without the ratio it fits the 24 GB card alone
    assert not any("lopsided" in w for w in balanced.warnings)


def test_prefer_latency_uses_tensor_split_on_nvlink(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "70b-q4_0", "2x141gb-nvlink", prefer="latency")
    assert layout(plan) == "0,1/tensor" and plan.replicas[0].tensor_split == (0.5, 0.5)
    pcie = plan_for(models, "7b-q4_0", "2x24gb-pcie", prefer="latency")
    assert layout(pcie) == DP2  # no NVLink: latency changes nothing


def test_70b_on_four_h200s(models: dict[str, ModelInfo]) -> None:
    """Issue 8's plans: Q8_0 fits one H200 (a replica per GPU); F16 does not, and throughput takes two 2-GPU tensor
    splits over one 4-GPU split, which latency takes instead."""
    cfg = {"parallel": 32, "context_length": 4096}
    assert layout(plan_for(models, "70b-q8_0", "4x141gb-nvlink", **cfg)) == "0/none 1/none 2/none 3/none"
    assert layout(plan_for(models, "70b-f16", "4x141gb-nvlink", **cfg)) == "0,1/tensor 2,3/tensor"
    one = plan_for(models, "70b-f16", "4x141gb-nvlink", prefer="latency", **cfg)
    assert layout(one) == "0,1,2,3/tensor" and one.replicas[0].tensor_split == (0.25, 0.25, 0.25, 0.25)


def test_explicit_tensor_over_pcie_is_honoured_with_a_warning(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "13b-q4_0", "2x24gb-pcie", split_mode="tensor")
    assert layout(plan) == "0,1/tensor"
    assert any("tensor split over PCIe" in w for w in plan.warnings)


def test_explicit_layer_on_four_gpus_uses_the_fewest_per_replica(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "7b-q4_0", "4x80gb-nvlink", split_mode="layer")
    assert layout(plan) == "0,1/layer 2,3/layer"


def test_split_mode_none_refuses_a_model_no_gpu_holds(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "70b-q4_0", "2x24gb-pcie", split_mode="none")
    assert not plan.fits
    assert any("split_mode: auto would split it" in x for x in plan.reasons)


def test_replicas_are_honoured_or_refused(models: dict[str, ModelInfo]) -> None:
    one = plan_for(models, "7b-q4_0", "4x80gb-nvlink", replicas=1, main_gpu=2)
    assert layout(one) == "2/none" and one.replicas[0].main_gpu == 2
    assert sum("stays unused" in w for w in one.warnings) == 3
    too_many = plan_for(models, "7b-q4_0", "1x24gb", replicas=2)
    assert not too_many.fits and any("only 1 can" in x for x in too_many.reasons)
    grouped = plan_for(models, "70b-f16", "4x80gb-nvlink", replicas=1)
    assert layout(grouped) == "0,1,2,3/tensor"
    short = plan_for(models, "7b-q4_0", "4x80gb-two-nvlink-pairs", split_ratio=[1, 1, 1], replicas=2)
    assert not short.fits and any("replicas: 2 of 3 GPUs each needs 6 GPUs; 4 are selected" in x
                                  for x in short.reasons)


def test_contradictory_choices_are_flagged(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "7b-q4_0", "2x24gb-pcie", split_mode="none", split_ratio=[0.5, 0.5], main_gpu=3)
    assert layout(plan) == DP2
    assert any("split_ratio is ignored" in w for w in plan.warnings)
    assert any("main_gpu 3 is not used" in w for w in plan.warnings)


def test_gpu_selection(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "7b-q4_0", "4x80gb-nvlink", gpus=[1, 3])
    assert layout(plan) == "1/none 3/none" and [b.device for b in plan.budgets] == ["GPU 1", "GPU 3"]
    missing = plan_for(models, "7b-q4_0", "2x24gb-pcie", gpus=[0, 5])
    assert not missing.fits and any("gpus lists [5]" in x for x in missing.reasons)


def test_quantized_kv_without_flash_attention_is_refused(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "7b-q4_0", "1x24gb", kv_cache_type="q8_0", flash_attn=False)
    assert not plan.fits and any("needs flash attention" in x for x in plan.reasons)
    q8 = plan_for(models, "7b-q8_0", "1x24gb", kv_cache_type="q8_0")
    assert q8.fits and q8.budgets[0].kv_mib == 8704  # 16 GiB x 34/64


def test_refusal_advice_fits_when_followed(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "70b-q4_0", "2x24gb-pcie", parallel=8, context_length=4096)
    advice = next(x for x in plan.reasons if x.startswith("lower context_length to "))
    ctx = int(advice.split()[3])
    assert plan_for(models, "70b-q4_0", "2x24gb-pcie", context_length=ctx).fits
    weights_only = plan_for(models, "70b-f16", "2x24gb-pcie")
    assert any(x.startswith("a Q4_0 file of this model would need about") for x in weights_only.reasons)


def test_context_rounding_and_training_length_warnings(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "7b-q4_0", "2x141gb-nvlink", context_length=5000, batch_size=8192)
    assert plan.n_ctx_per_seq == 5120 and plan.n_batch == 8192 and plan.n_ubatch == 512  # min(batch_size, 512)
    assert any("rounded up to 5120" in w for w in plan.warnings)
    assert any("exceeds the 4096 tokens the model was trained on" in w for w in plan.warnings)


def test_cpu_plan_shares_weights_and_checks_ram(models: dict[str, ModelInfo]) -> None:
    m = models["7b-q4_0"]
    empty = Inventory((), (), "none", note="NVML not available: test", host_mem_mib=64000)
    plan = make_plan(m, empty, FleetConfig(replicas=2, parallel=2, context_length=2048))
    assert plan.fits and plan.device == "cpu" and len(plan.replicas) == 2
    assert all(r.gpus == () and r.split_mode == "none" for r in plan.replicas)
    (b,) = plan.budgets
    assert b.weights_mib * 2**20 == pytest.approx(m.weights_bytes, abs=2**20)  # once, not per replica
    assert b.kv_mib == 2 * 2048  # 2 replicas x 2 slots x 2048 tokens x 512 KiB
    assert any("NVML not available: test" in x for x in plan.reasons)
    small = make_plan(m, Inventory((), (), "none", host_mem_mib=8000), FleetConfig(parallel=8))
    assert not small.fits and any("MiB of RAM but 8000 MiB are available" in x for x in small.reasons)
    unknown = make_plan(m, Inventory((), (), "none"), FleetConfig())
    assert unknown.fits and any("RAM is unknown" in w for w in unknown.warnings)


def test_no_offload_means_cpu_plan(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "7b-q4_0", "1x24gb", n_gpu_layers=0)
    assert plan.device == "cpu" and any("n_gpu_layers: 0" in x for x in plan.reasons)


def test_json_form(models: dict[str, ModelInfo]) -> None:
    d = plan_for(models, "70b-f16", "4x80gb-nvlink").to_json()
    assert d["fits"] is True and isinstance(d["reasons"], list) and all(isinstance(x, str) for x in d["reasons"])
    assert d["replicas"] == [
        {"gpus": [0, 1], "split_mode": "tensor", "tensor_split": [0.5, 0.5], "main_gpu": 0},
        {"gpus": [2, 3], "split_mode": "tensor", "tensor_split": [0.5, 0.5], "main_gpu": 2},
    ]
    assert {"weights_mib", "kv_mib", "compute_mib", "margin_mib", "capacity_mib", "used_mib"} <= set(d["budgets"][0])


def test_launch_spec_pins_each_replica_to_its_gpus(models: dict[str, ModelInfo]) -> None:
    cfg = FleetConfig(main_gpu=3, kv_cache_type="q8_0", llama_log_level="info")
    plan = make_plan(models["70b-f16"], inventory("4x80gb-nvlink"), cfg)
    env, engine = launch_spec(plan, 1, cfg, "/models/m.gguf")
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert (engine.split_mode, engine.tensor_split, engine.main_gpu) == ("tensor", (0.5, 0.5), 1)  # GPU 3 -> 1
    assert (engine.model_path, engine.n_seq, engine.n_ctx_per_seq, engine.n_gpu_layers) == ("/models/m.gguf", 8,
                                                                                             4096, -1)
    assert (engine.kv_cache_type, engine.llama_log_level, engine.n_batch, engine.n_ubatch, engine.prefill_tokens) == (
        "q8_0", "info", 2048, 512, 512)
    assert engine.overlap  # a GPU's decode runs while the host turns the last step's tokens into text
    with pytest.raises(IndexError, match="replica 2 is not in the plan"):
        launch_spec(plan, 2, cfg, "m.gguf")


def test_launch_spec_on_cpu_hides_gpus_and_shares_threads(models: dict[str, ModelInfo]) -> None:
    cfg = FleetConfig(replicas=2)
    plan = make_plan(models["7b-q4_0"], Inventory((), (), "none"), cfg)
    env, engine = launch_spec(plan, 0, cfg, "m.gguf")
    assert env["CUDA_VISIBLE_DEVICES"] == "" and engine.n_gpu_layers == 0 and engine.tensor_split == ()
    assert engine.n_threads == max(1, len(os.sched_getaffinity(0)) // 2)
    assert not engine.overlap  # a CPU decode returns when done: overlapping would ship each token a pass later
    assert launch_spec(plan, 1, FleetConfig(replicas=2, threads=3), "m.gguf")[1].n_threads == 3
    assert engine.prefix_cache and not launch_spec(plan, 1, FleetConfig(replicas=2, prefix_cache=False),
                                                   "m.gguf")[1].prefix_cache


def test_launch_spec_refuses_a_plan_that_does_not_fit(models: dict[str, ModelInfo]) -> None:
    plan = plan_for(models, "70b-f16", "1x24gb")
    with pytest.raises(ValueError, match="does not fit"):
        launch_spec(plan, 0, FleetConfig(), "m.gguf")


def test_plan_command(models: dict[str, ModelInfo], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    inv = str(ROOT / "examples" / "inventories" / "2x141gb-nvlink.yaml")
    assert main(["plan", "--model", models["70b-q4_0"].path, "--inventory", inv, "--json", "--prefer", "latency"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["fits"] is True and d["replicas"][0]["split_mode"] == "tensor"
    assert d["inventory"] == "file:2x141gb-nvlink.yaml"
    assert main(["plan", "--model", models["70b-f16"].path, "--inventory", inv, "--ctx", "65536",
                 "--parallel", "8"]) == 1
    text = capsys.readouterr().out
    assert "DOES NOT FIT" in text and "overflows by" in text and "lower context_length to" in text
    assert main(["plan", "--model", models["7b-q4_0"].path, "--inventory", inv, "--parallel", "4"]) == 0
    text = capsys.readouterr().out
    assert "FITS (2 replica(s) on the gpu)" in text and "GPU 1   1" in text and "4 slots x 4096 tokens" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [{name: x}]\n")
    assert main(["plan", "--model", models["7b-q4_0"].path, "--inventory", str(bad)]) == 2
    assert "total_mib" in capsys.readouterr().err
    assert main(["plan", "--model", str(bad), "--inventory", inv]) == 3  # not a model: its own exit code
    assert "is not a GGUF file" in capsys.readouterr().err


def test_the_kv_ram_tier_is_sized_from_the_ram_left_and_counted_against_it(models: dict[str, ModelInfo]) -> None:
    m, MiB = models["7b-q4_0"], 2**20
    cpu = Inventory((), (), "none", host_mem_mib=64000)
    plan = make_plan(m, cpu, FleetConfig(replicas=2, parallel=2, context_length=2048))
    (b,) = plan.budgets
    left = 64000 - (b.used_mib - b.kv_tier_mib)
    assert plan.kv_tier_mib == min(8192, left // 4 // 2) and b.kv_tier_mib == 2 * plan.kv_tier_mib
    assert launch_spec(plan, 0, FleetConfig(replicas=2), "m.gguf")[1].cache_ram_bytes == plan.kv_tier_mib * MiB
    # an explicit bound is taken as it is, counted, and a plan it overflows does not fit
    big = make_plan(m, cpu, FleetConfig(replicas=2, parallel=2, context_length=2048, cache_ram_mib=30000))
    assert not big.fits and big.budgets[0].kv_tier_mib == 60000
    assert any("cache_ram_mib 30000 x 2 replica(s)" in w for w in big.warnings)
    off = make_plan(m, cpu, FleetConfig(parallel=2, context_length=2048, prefix_cache=False))
    assert off.kv_tier_mib == 0 and launch_spec(off, 0, FleetConfig(prefix_cache=False), "m")[1].cache_ram_bytes == 0
    gpu = plan_for(models, "7b-q4_0", "2x141gb-nvlink", cache_dir="/kv")
    assert gpu.kv_tier_mib == 1024  # on GPUs too (the engine stops saving where prefilling is faster)
    assert any("measured to cost less than prefilling" in r for r in gpu.reasons)
    assert plan_for(models, "7b-q4_0", "2x141gb-nvlink", cache_ram_mib=4096).kv_tier_mib == 4096
    spec = launch_spec(gpu, 0, FleetConfig(cache_dir="/kv"), "m")[1]
    assert (spec.cache_dir, spec.cache_disk_bytes) == ("/kv", 20480 * MiB)


def test_parked_sequences_cost_a_slot_s_kv_each_and_reach_the_engine(models: dict[str, ModelInfo]) -> None:
    base = plan_for(models, "7b-q4_0", "2x141gb-nvlink", parallel=16, context_length=8192)
    parked = plan_for(models, "7b-q4_0", "2x141gb-nvlink", parallel=16, context_length=8192, cache_park=8)
    # 7B: 512 KiB per token; 8 parked sequences of 8192 tokens and the spare = 36 GiB more per replica
    assert parked.budgets[0].kv_mib - base.budgets[0].kv_mib == (8 + 1) * 8192 * 512 // 1024
    assert any("(and 8 parked sessions)" in r for r in parked.reasons)
    assert launch_spec(parked, 0, FleetConfig(cache_park=8), "m")[1].n_park == 8
    too_many = plan_for(models, "7b-q4_0", "4x80gb-nvlink", parallel=16, context_length=8192, cache_park=60,
                        gpus=[0])
    assert not too_many.fits  # 77 sequences of 4 GiB do not fit one 80 GB GPU
    off = plan_for(models, "7b-q4_0", "2x141gb-nvlink", parallel=16, context_length=8192, cache_park=8,
                   prefix_cache=False)
    assert off.budgets[0].kv_mib == base.budgets[0].kv_mib
    # the plan says how many more the memory it leaves would hold, and that many fit where one more does not
    (room,) = [r for r in base.reasons if "more parked session(s) per replica" in r]
    n = int(room.split(" would hold ")[1].split()[0])
    assert n >= 8 and "4096 MiB each" in room
    one_gpu = {"parallel": 16, "context_length": 8192, "gpus": [0]}
    assert plan_for(models, "7b-q4_0", "2x141gb-nvlink", cache_park=n, **one_gpu).fits
    assert not plan_for(models, "7b-q4_0", "2x141gb-nvlink", cache_park=n + 1, **one_gpu).fits
