"""The planner counts a model's LoRA adapters (their tensors' bytes, beside the weights on the same devices) and
refuses a plan whose adapter is not one or adapts another model; bad ``lora:`` entries are config errors naming the
field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from test_planner import inventory

from llamafleet.config import FleetConfig
from llamafleet.model.adapter import read_adapter_info
from llamafleet.model.header import ModelInfo
from llamafleet.model.synth_lora import write_lora
from llamafleet.placement.advice import mib
from llamafleet.placement.planner import make_plan
from synth_models import sparse_models

SHAPE = {"parallel": 8, "context_length": 4096}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelInfo]:
    return sparse_models(tmp_path_factory)


@pytest.fixture(scope="module")
def adapter(models: dict[str, ModelInfo], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lora(models["7b-q4_0"].path, tmp_path_factory.mktemp("lora") / "style.gguf", rank=16)


def test_adapters_tensors_are_counted_with_the_weights(models: dict[str, ModelInfo], adapter: Path) -> None:
    alone = make_plan(models["7b-q4_0"], inventory("1x24gb"), FleetConfig(**SHAPE))  # type: ignore[arg-type]
    both = make_plan(models["7b-q4_0"], inventory("1x24gb"), FleetConfig(**SHAPE, lora=[str(adapter), {
        "path": str(adapter), "name": "again"}]))  # type: ignore[arg-type]
    assert alone.fits and both.fits
    size = read_adapter_info(adapter).tensor_bytes
    assert both.budgets[0].weights_mib - alone.budgets[0].weights_mib == pytest.approx(mib(2 * size), abs=2)
    assert any("2 LoRA adapters" in r and "counted with them" in r for r in both.reasons), both.reasons


def test_a_model_file_given_as_an_adapter_refuses_the_plan(models: dict[str, ModelInfo]) -> None:
    plan = make_plan(models["7b-q4_0"], inventory("1x24gb"), FleetConfig(
        **SHAPE, lora=[models["13b-q4_0"].path]))  # type: ignore[arg-type]
    assert not plan.fits
    assert any(r.startswith("lora[0] (llama2-13b-q4_0):") and "not a LoRA adapter" in r for r in plan.reasons)


def test_a_missing_adapter_file_refuses_the_plan(models: dict[str, ModelInfo]) -> None:
    plan = make_plan(models["7b-q4_0"], inventory("1x24gb"), FleetConfig(**SHAPE, lora=[
        {"path": "missing.gguf", "name": "gone"}]))  # type: ignore[arg-type]
    assert not plan.fits
    assert "lora[0] (gone): no file at missing.gguf; give a LoRA adapter GGUF of this model" in plan.reasons


@pytest.mark.parametrize(("entry", "words"), [
    ({"path": "hf:nope"}, "lora.0\n  Value error, 'hf:nope' names no repo (ORG/REPO)"),
    ({"path": "ADAPTER", "scale": "high"}, "lora.0.scale\n  Input should be a valid number"),
    ({"path": "ADAPTER", "scale": float("nan")}, "lora.0.scale\n  Input should be a finite number"),
    ({"path": "ADAPTER", "name": "a:b"}, "name 'a:b': use letters, digits"),
    ({"path": "ADAPTER", "size": 3}, "lora.0.size\n  Extra inputs are not permitted"),
])
def test_bad_entries_name_the_field_and_the_fix(adapter: Path, entry: dict[str, object], words: str) -> None:
    entry = {k: str(adapter) if v == "ADAPTER" else v for k, v in entry.items()}
    with pytest.raises(ValidationError) as e:
        FleetConfig(lora=[entry])  # type: ignore[list-item]
    assert words in str(e.value)


def test_two_adapters_of_one_name_are_refused(adapter: Path) -> None:
    with pytest.raises(ValidationError, match="lora: the name 'style' is given to two adapters; give each its own"):
        FleetConfig(lora=[str(adapter), {"path": str(adapter)}])  # type: ignore[list-item]
