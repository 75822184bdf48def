"""Logprobs for evaluation on the real model (SmolLM2-135M-Instruct), in the engine: the top alternatives of each
token and the scores of prompt tokens (loglikelihood), checked against numpy on the same logits, and batched
neighbours left as they were."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamafleet.engine.engine import Engine  # isort: skip  (llama.cpp before numpy: see engine/llama.py)
import numpy as np  # isort: skip

from llamafleet.engine.types import EngineConfig, Request, SamplingParams
from llamafleet.model.demo import default_model_path

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    # n_batch 16: a longer prompt is prefilled (and scored) in several chunks
    cfg = EngineConfig(model_path=str(default_model_path(progress=False)), n_seq=4, n_ctx_per_seq=256, n_batch=16)
    with Engine(cfg) as eng:
        yield eng


def log_softmax(row: np.ndarray) -> np.ndarray:
    r = row.astype(np.float64)
    return r - (r.max() + np.log(np.exp(r - r.max()).sum()))


def test_top_logprobs_match_numpy_on_the_same_logits(engine: Engine) -> None:
    p = SamplingParams(max_tokens=1, temperature=0.0, logprobs=True, top_logprobs=5)
    out = engine.generate([Request("t", tuple(engine.tokenize(PROMPTS[0])), p)])["t"]
    ref = log_softmax(engine.ctx.logits(1)[0])  # the last pass was this sequence's only sampled row
    top = out.top_logprobs[0]
    assert [t for t, _ in top] == list(np.argsort(-ref)[:5])
    assert np.allclose([lp for _, lp in top], np.sort(ref)[::-1][:5], atol=1e-5)
    assert out.token_ids[0] == top[0][0] and out.logprobs[0] == pytest.approx(top[0][1], abs=1e-6)  # greedy


def test_sampled_token_is_in_its_top_alternatives_and_they_are_sorted(engine: Engine) -> None:
    p = SamplingParams(max_tokens=16, temperature=1.0, seed=7, logprobs=True, top_logprobs=20, ignore_eos=True)
    out = engine.generate([Request("s", tuple(engine.tokenize(PROMPTS[2])), p)])["s"]
    assert len(out.top_logprobs) == len(out.token_ids) == 16
    for tok, lp, top in zip(out.token_ids, out.logprobs, out.top_logprobs, strict=True):
        lps = [v for _, v in top]
        assert len(top) == 20 and lps == sorted(lps, reverse=True)
        if lp >= lps[-1]:
            assert dict(top)[tok] == pytest.approx(lp, abs=1e-6)


def test_greedy_neighbours_are_unaffected(engine: Engine) -> None:
    plain = engine.generate([Request(f"g{i}", tuple(engine.tokenize(t)), GREEDY) for i, t in enumerate(PROMPTS)])
    scoring = SamplingParams(max_tokens=4, temperature=0.0, logprobs=True, top_logprobs=3, prompt_logprobs=True)
    mixed = engine.generate([
        Request("score", tuple(engine.tokenize(PROMPTS[2] * 3)), scoring),
        *[Request(f"m{i}", tuple(engine.tokenize(t)), GREEDY) for i, t in enumerate(PROMPTS)],
    ])
    for i in range(len(PROMPTS)):
        assert mixed[f"m{i}"].token_ids == plain[f"g{i}"].token_ids
        assert mixed[f"m{i}"].top_logprobs == [] and mixed[f"m{i}"].prompt_logprobs is None


def test_prompt_scores_equal_the_scores_of_generated_tokens(engine: Engine) -> None:
    """Scoring prompt + answer gives each answer token the logprob it had when generated, across prefill chunks."""
    ids = tuple(engine.tokenize(PROMPTS[2] * 2))  # longer than n_batch: several chunks
    gen = engine.generate([Request("g", ids, SamplingParams(max_tokens=8, temperature=0.0, logprobs=True,
                                                            ignore_eos=True))])["g"]
    whole = ids + tuple(gen.token_ids)
    p = SamplingParams(max_tokens=0, logprobs=True, top_logprobs=2, prompt_logprobs=True)
    scored = engine.generate([Request("p", whole, p)])["p"]
    assert scored.token_ids == [] and scored.finish_reason == "length" and scored.completion_tokens == 0
    sp = scored.prompt_logprobs
    assert sp is not None and sp.token_ids == list(whole) and len(sp.logprobs) == len(whole) - 1
    assert np.allclose(sp.logprobs[-8:], gen.logprobs, atol=1e-3)
    assert sp.top is not None and len(sp.top) == len(sp.logprobs)
    assert [t[0][0] for t in sp.top[-8:]] == gen.token_ids  # greedy: each answer token was the best


def test_scoring_ranks_the_right_answer_higher_and_ignores_the_prefix_cache(engine: Engine) -> None:
    def score(text: str) -> float:
        p = SamplingParams(max_tokens=0, logprobs=True, prompt_logprobs=True)
        out = engine.generate([Request(text, tuple(engine.tokenize(text)), p)])[text]
        assert out.prompt_logprobs is not None and out.cached_tokens == 0
        return out.prompt_logprobs.logprobs[-1]

    stem = "The capital of France is"
    paris, london = score(stem + " Paris"), score(stem + " London")
    assert paris > london
    assert score(stem + " Paris") == pytest.approx(paris, abs=1e-4)  # its KV is cached now, and not reused


def test_max_tokens_zero_needs_prompt_logprobs() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="top_logprobs needs logprobs"):
        SamplingParams(top_logprobs=3)


def test_out_of_range_token_ids_name_their_index(engine: Engine) -> None:
    with pytest.raises(ValueError, match="at prompt index 2"):
        engine.add_request(Request("bad", (1, 2, engine.model.n_vocab + 5), GREEDY))
