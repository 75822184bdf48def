"""Which configurations the consistency check runs, and where the planner puts each (nothing is loaded here).

The model facts come from the real demo model's GGUF header; the machines are the project's inventory files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafleet.config import FleetConfig
from llamafleet.consistency.run import (
    DEFAULT_CONFIGS,
    CheckOptions,
    ConfigNameError,
    Setup,
    parse_configs,
    setups,
    usable_inventory,
)
from llamafleet.model.demo import default_model_path
from llamafleet.model.header import ModelInfo, read_model_info
from llamafleet.placement.gpus import Inventory, empty_inventory, load_inventory

INVENTORIES = Path(__file__).resolve().parents[3] / "examples" / "inventories"


@pytest.fixture(scope="module")
def model() -> ModelInfo:
    return read_model_info(default_model_path(progress=False))


def opts(configs: tuple[str, ...] = DEFAULT_CONFIGS, **fleet: object) -> CheckOptions:
    cfg = FleetConfig.model_validate({"context_length": 512, "threads": 2, **fleet})
    return CheckOptions(cfg, "model.gguf", configs, max_tokens=16, concurrency=4)


def by_name(planned: list[Setup]) -> dict[str, tuple[Setup, int]]:
    return {name: (s, i) for s in planned for i, name in enumerate(s.names)}


def test_parse_configs_puts_the_reference_first_once() -> None:
    assert parse_configs("batched, replica-1,batched") == ("reference", "batched", "replica-1")
    assert parse_configs("tensor,reference,nbatch-32") == ("reference", "tensor", "nbatch-32")
    assert parse_configs("") == ("reference",)


@pytest.mark.parametrize("bad", ["batch", "nbatch-0", "nbatch-x", "replica", "replica--1", "row"])
def test_parse_configs_names_the_bad_entry_and_the_valid_forms(bad: str) -> None:
    with pytest.raises(ConfigNameError, match=rf"unknown configuration '{bad}'; use reference, batched, nbatch-<k>"):
        parse_configs(f"batched,{bad}")


def test_options_refuse_a_run_without_the_reference_first() -> None:
    with pytest.raises(ValueError, match="must start with 'reference'"):
        CheckOptions(FleetConfig(), "m.gguf", ("batched",))


def test_cpu_runs_everything_but_the_splits(model: ModelInfo) -> None:
    planned, skipped = setups(opts(), model, empty_inventory("no GPU found"))
    assert [s.names for s in planned] == [("reference",), ("batched",), ("nbatch-16",), ("replica-0", "replica-1")]
    assert {r.name: r.status for r in skipped} == {"layer": "skipped", "tensor": "skipped"}
    assert all("2 or more GPUs" in r.note and "no GPU found" in r.note for r in skipped)
    runs = by_name(planned)
    ref = runs["reference"][0].specs[0].engine
    assert (runs["reference"][0].concurrency, ref.n_seq, ref.n_batch, ref.n_gpu_layers) == (1, 1, 512, 0)
    batched = runs["batched"][0]
    assert (batched.concurrency, batched.specs[0].engine.n_seq) == (4, 4)
    nb = runs["nbatch-16"][0].specs[0].engine
    assert (nb.n_batch, nb.n_ubatch, nb.n_seq) == (16, 16, 1)
    replica_set = runs["replica-0"][0]
    assert replica_set.concurrency == 1 and len(replica_set.specs) == 2
    # Only the variable under test differs: same threads, context and model everywhere.
    engines = [spec.engine for s in planned for spec in s.specs]
    assert {(e.n_threads, e.n_ctx_per_seq, e.model_path, e.kv_cache_type) for e in engines} == {
        (2, 512, "model.gguf", "f16")}
    assert {spec.label for s in planned for spec in s.specs} == {"CPU"}


def test_two_nvlinked_gpus_place_every_configuration(model: ModelInfo) -> None:
    inv = load_inventory(INVENTORIES / "2x141gb-nvlink.yaml")
    planned, skipped = setups(opts(), model, inv)
    assert skipped == []
    runs = by_name(planned)

    def spec(name: str) -> tuple[str, str, str, tuple[float, ...]]:
        s, i = runs[name]
        sp = s.specs[i]
        return sp.label, sp.env["CUDA_VISIBLE_DEVICES"], sp.engine.split_mode, sp.engine.tensor_split

    assert spec("reference") == ("GPU 0", "0", "none", ())
    assert spec("batched")[:3] == spec("nbatch-16")[:3] == ("GPU 0", "0", "none")
    assert spec("replica-0")[:2] == ("GPU 0", "0") and spec("replica-1")[:2] == ("GPU 1", "1")
    for mode in ("layer", "tensor"):
        label, visible, split, ratios = spec(mode)
        assert (label, visible, split) == ("GPUs 0,1", "0,1", mode)
        assert len(ratios) == 2 and sum(ratios) == pytest.approx(1.0, abs=1e-3)
    assert all(spec.engine.n_gpu_layers == -1 for s in planned for spec in s.specs)


def test_one_gpu_skips_splits_and_the_second_replica_with_reasons(model: ModelInfo) -> None:
    inv = load_inventory(INVENTORIES / "1x24gb.yaml")
    planned, skipped = setups(opts(), model, inv)
    assert [s.names for s in planned] == [("reference",), ("batched",), ("nbatch-16",)]
    notes = {r.name: r.note for r in skipped}
    assert "only 1 GPU selected" in notes["layer"] and "only 1 GPU selected" in notes["tensor"]
    assert "replicas: 2 needs 2 GPUs" in notes["replica-0"] == notes["replica-1"]


def test_replica_names_load_the_whole_set(model: ModelInfo) -> None:
    planned, _ = setups(opts(("reference", "replica-2")), model, empty_inventory("no GPU"))
    assert [s.names for s in planned] == [("reference",), ("replica-0", "replica-1", "replica-2")]


def test_gpus_of_a_cpu_only_build_are_not_used() -> None:
    inv = load_inventory(INVENTORIES / "2x141gb-nvlink.yaml")
    assert usable_inventory(inv, lambda: True) is inv
    cpu = usable_inventory(inv, lambda: False)
    assert cpu.gpus == () and cpu.note is not None and "CPU-only build" in cpu.note

    def never() -> bool:
        raise AssertionError("llama.cpp is only asked about offload when there are GPUs")

    none = empty_inventory("no GPU found")
    assert usable_inventory(none, never) is none


def test_selected_gpus_limit_the_splits(model: ModelInfo) -> None:
    inv: Inventory = load_inventory(INVENTORIES / "2x141gb-nvlink.yaml")
    planned, skipped = setups(opts(("reference", "layer"), gpus=[1]), model, inv)
    assert by_name(planned)["reference"][0].specs[0].env["CUDA_VISIBLE_DEVICES"] == "1"
    assert [(r.name, "only 1 GPU selected" in r.note) for r in skipped] == [("layer", True)]


def test_gguf_runs_the_converted_file_on_llama_cpp_and_is_skipped_for_a_gguf_model(model: ModelInfo) -> None:
    """``gguf`` (a checkpoint folder's weights as an F16 GGUF) is placed as the reference, from its own file; for a
    model that is already a GGUF file it is skipped with the reason."""
    demo = str(default_model_path(progress=False))
    planned, skipped = setups(opts(("reference", "gguf")), model, empty_inventory("no GPU found"))
    assert [r.name for r in skipped] == ["gguf"] and "this model is a GGUF file" in (skipped[0].note or "")
    with_file = CheckOptions(opts().fleet, "ckpt-folder", ("reference", "gguf"), max_tokens=16, gguf=demo)
    planned, skipped = setups(with_file, model, empty_inventory("no GPU found"))
    (setup, _) = by_name(planned)["gguf"]
    assert not skipped and setup.specs[0].engine.model_path == demo and setup.specs[0].engine.engine == "llama.cpp"
