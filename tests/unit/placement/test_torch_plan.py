"""Plans of checkpoint folders (the torch engine): one GPU per replica when it fits, whole layers over GPUs when it
does not (never a tensor split), each CPU replica with its own copy, and llama.cpp's knobs refused with the fix."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llamafleet.config import FleetConfig
from llamafleet.engine.devices import layer_devices
from llamafleet.model.checkpoint import describe
from llamafleet.model.header import ModelInfo
from llamafleet.model.synth import Shape
from llamafleet.model.synth_hf import write_weights
from llamafleet.placement.gpus import Inventory, load_inventory
from llamafleet.placement.plan import Plan
from llamafleet.placement.planner import launch_spec, make_plan
from synth_models import sparse_models

ROOT = Path(__file__).resolve().parents[3]
CPU = Inventory(gpus=(), links=(), source="none", host_mem_mib=4096)


@pytest.fixture(scope="module")
def llama7b(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    """LLaMA-2 7B's shape in fp16, as a checkpoint folder describes it (the GGUF's byte counts, the torch engine)."""
    return replace(sparse_models(tmp_path_factory)["7b-f16"], engine="torch", file_type="F16", path="llama-7b")


def inventory(name: str) -> Inventory:
    return load_inventory(ROOT / "examples" / "inventories" / f"{name}.yaml")


def test_one_replica_per_gpu_when_it_fits(llama7b: ModelInfo) -> None:
    plan = make_plan(llama7b, inventory("2x141gb-nvlink"), FleetConfig(parallel=8, context_length=4096))
    assert plan.fits and [(r.gpus, r.split_mode) for r in plan.replicas] == [((0,), "none"), ((1,), "none")]
    (gpu0, _) = plan.budgets
    kv = 8 * 4096 * 32 * 32 * 128 * 2 * 2  # slots x tokens x layers x kv heads x head dim x (K, V) x fp16
    assert gpu0.kv_mib == kv >> 20 and gpu0.weights_mib == -(-llama7b.weights_bytes // (1 << 20))


def test_a_layer_split_with_nvlink_too_and_its_device_map(llama7b: ModelInfo) -> None:
    """2 x 24 GB (PCIe) and 4 x 80 GB (NVLink, where GGUF's replicas would be tensor-split) alike: whole layers."""
    plan = make_plan(llama7b, inventory("2x24gb-pcie"), FleetConfig(parallel=8, context_length=4096))
    assert plan.fits and [(r.gpus, r.split_mode) for r in plan.replicas] == [((0, 1), "layer")]
    _, engine = launch_spec(plan, 0, FleetConfig(), "llama-7b")
    assert engine.split_mode == "layer" and len(engine.tensor_split) == 2
    where = layer_devices(32, engine.tensor_split)
    assert set(where) == {0, 1} and list(where) == sorted(where)
    big = make_plan(llama7b, inventory("4x80gb-nvlink"), FleetConfig(parallel=16, context_length=16384))
    assert big.fits and {r.split_mode for r in big.replicas} == {"layer"}


def test_llama_cpp_knobs_are_refused_with_the_fix(llama7b: ModelInfo) -> None:
    plan = make_plan(llama7b, inventory("2x24gb-pcie"), FleetConfig(kv_cache_type="q8_0", split_mode="tensor"))
    assert not plan.fits
    why = " ".join(plan.reasons)
    assert "torch engine" in why and "kv_cache_type q8_0" in why and "split_mode: tensor" in why
    assert "convert the model to GGUF" in why


def test_engine_key_must_match_the_path(llama7b: ModelInfo, tmp_path: Path) -> None:
    plan = make_plan(llama7b, CPU, FleetConfig(engine="llama.cpp"))
    assert not plan.fits and "is a checkpoint folder, which the torch engine serves" in " ".join(plan.reasons)
    gguf = replace(llama7b, engine="llama.cpp", path="m.gguf")
    plan = make_plan(gguf, CPU, FleetConfig(engine="torch"))
    assert not plan.fits and "set engine: llama.cpp (or auto), or give a checkpoint folder" in " ".join(plan.reasons)


def test_cpu_replicas_each_hold_their_own_weights(tmp_path: Path) -> None:
    folder = write_weights(tmp_path / "m", Shape("t", 2, 64, 4, 2, 128, n_vocab=50_000), "f32")
    info = describe(folder)
    one = make_plan(info, CPU, FleetConfig(replicas=1, parallel=2, context_length=256))
    two = make_plan(info, CPU, FleetConfig(replicas=2, parallel=2, context_length=256))
    assert two.budgets[0].weights_mib in (2 * one.budgets[0].weights_mib, 2 * one.budgets[0].weights_mib - 1)
    assert one.kv_tier_mib == 0  # no prefix cache in the torch engine, so no RAM tier of it
    _, engine = launch_spec(one, 0, FleetConfig(), str(folder))
    assert engine.engine == "torch"


def test_the_plan_says_what_the_torch_engine_does(llama7b: ModelInfo) -> None:
    """`plan`'s context line for a checkpoint folder: its KV cache's dtype, no flash attention or n_ubatch (both
    llama.cpp's), and whether its decode steps replay CUDA graphs; the JSON's kv_type and flash_attn agree."""
    from llamafleet.commands.plan import format_plan

    def context(plan: Plan, model: ModelInfo, inv: Inventory, graphs: bool = True) -> str:
        return next(ln for ln in format_plan(plan, model, inv, graphs).splitlines() if ln.startswith("context:"))

    gpus = inventory("2x141gb-nvlink")
    one = make_plan(llama7b, gpus, FleetConfig(parallel=8, context_length=4096))
    line = context(one, llama7b, gpus)
    assert "KV cache f16, the weights' dtype" in line and "no flash attention" in line
    assert "flash attention auto" not in line and "n_ubatch" not in line
    assert line.endswith("decode steps replayed as CUDA graphs")
    assert context(one, llama7b, gpus, graphs=False).endswith("decode steps eager (cuda_graphs: off)")
    assert (one.kv_type, one.flash_attn) == ("f16", False)
    pcie = inventory("2x24gb-pcie")
    split = make_plan(llama7b, pcie, FleetConfig(parallel=8, context_length=4096))
    assert context(split, llama7b, pcie).endswith("decode steps eager (a layer split over several GPUs)")
    fp32 = replace(llama7b, file_type="F32")
    host = Inventory(gpus=(), links=(), source="none", host_mem_mib=1 << 20)
    on_cpu, on_gpu = make_plan(fp32, host, FleetConfig(parallel=2)), make_plan(fp32, gpus, FleetConfig(parallel=2))
    assert "KV cache f32" in context(on_cpu, fp32, host) and context(on_cpu, fp32, host).endswith("eager (on the CPU)")
    assert "KV cache bf16" in context(on_gpu, fp32, gpus)
    gguf = replace(llama7b, engine="llama.cpp")
    plan = make_plan(gguf, gpus, FleetConfig(parallel=8, context_length=4096))
    assert context(plan, gguf, gpus).endswith("n_batch 2048, n_ubatch 512; KV cache f16; flash attention auto")
