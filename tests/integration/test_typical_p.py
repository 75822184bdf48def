"""``typical_p`` reaches llama.cpp's sampler chain (the real model, on CPU): locally typical sampling with a tiny
``p`` keeps one candidate, so every seed draws the same answer, where the full distribution lets seeds differ."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamafleet.engine.engine import Engine
from llamafleet.engine.types import EngineConfig, Request, SamplingParams
from llamafleet.model.demo import default_model_path

PROMPT = "Once upon a time, in a small village,"


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    cfg = EngineConfig(model_path=str(default_model_path(progress=False)), n_seq=4, n_ctx_per_seq=128, n_batch=128)
    with Engine(cfg) as eng:
        yield eng


def answers(engine: Engine, typical_p: float) -> set[str]:
    """The answers of four seeds, drawn from the whole distribution but for ``typical_p``."""
    params = [SamplingParams(max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=typical_p,
                             seed=seed, ignore_eos=True) for seed in range(4)]
    ids = tuple(engine.tokenize(PROMPT))
    done = engine.generate([Request(f"s{i}", ids, p) for i, p in enumerate(params)])
    return {g.text for g in done.values()}


def test_a_tiny_typical_p_leaves_one_candidate_whatever_the_seed(engine: Engine) -> None:
    assert len(answers(engine, 1.0)) > 1
    assert len(answers(engine, 1e-6)) == 1
