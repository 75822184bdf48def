"""The planner counts a draft model (speculative decoding) with the model it drafts for: its weights and its KV
for the same slots and context, on the same devices; a draft that is not a GGUF model refuses the plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_planner import inventory

from llamafleet.config import FleetConfig
from llamafleet.model.header import ModelInfo
from llamafleet.placement.advice import mib
from llamafleet.placement.memory import kv_bytes_per_token
from llamafleet.placement.planner import make_plan
from synth_models import sparse_models

SHAPE = {"parallel": 8, "context_length": 4096}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelInfo]:
    return sparse_models(tmp_path_factory)


def with_draft(path: str) -> FleetConfig:
    return FleetConfig(**SHAPE, speculative={"mode": "draft", "draft_model": path})  # type: ignore[arg-type]


def test_a_draft_models_weights_and_kv_are_counted_on_the_replicas_gpu(models: dict[str, ModelInfo]) -> None:
    target, draft = models["7b-q4_0"], models["13b-q4_0"]
    alone = make_plan(target, inventory("2x141gb-nvlink"), FleetConfig(**SHAPE))
    both = make_plan(target, inventory("2x141gb-nvlink"), with_draft(draft.path))
    assert alone.fits and both.fits
    a, b = alone.budgets[0], both.budgets[0]
    assert b.weights_mib - a.weights_mib == pytest.approx(mib(draft.weights_bytes), abs=2)
    draft_kv = kv_bytes_per_token(draft, "f16") * 8 * 4096
    assert b.kv_mib - a.kv_mib == pytest.approx(mib(int(draft_kv)), rel=0.01)
    assert any("draft model" in r and "its weights and KV are counted" in r for r in both.reasons)


def test_a_draft_that_does_not_fit_beside_the_model_refuses_the_plan(models: dict[str, ModelInfo]) -> None:
    target = models["7b-q4_0"]
    assert make_plan(target, inventory("1x24gb"), FleetConfig(**SHAPE)).fits
    plan = make_plan(target, inventory("1x24gb"), with_draft(target.path))
    assert not plan.fits
    assert any("overflows" in r for r in plan.reasons)


def test_a_draft_model_that_is_not_gguf_refuses_the_plan(models: dict[str, ModelInfo], tmp_path: Path) -> None:
    junk = tmp_path / "draft.gguf"
    junk.write_bytes(b"not a model")
    plan = make_plan(models["7b-q4_0"], inventory("1x24gb"), with_draft(str(junk)))
    assert not plan.fits
    assert any(r.startswith(f"speculative.draft_model {junk}:") for r in plan.reasons), plan.reasons


def test_mode_draft_without_a_draft_model_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mode draft needs draft_model"):
        FleetConfig(speculative={"mode": "draft"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="draft_model: no GGUF file at"):
        FleetConfig(speculative={"mode": "draft", "draft_model": str(tmp_path / "none.gguf")})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="draft_model is only used with mode draft"):
        FleetConfig(speculative={"mode": "ngram", "draft_model": str(tmp_path)})  # type: ignore[arg-type]
