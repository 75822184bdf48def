"""Speculative decoding is exact: on a deterministic context (tests/integration/fake_context.py, whose logits do
not depend on how the batch is cut), answers with prompt lookup equal answers without it, token for token, under
every kind of request (greedy, seeded sampling, penalties, logit bias, a grammar, stop strings, max_tokens,
logprobs); sampled answers keep the target's distribution (a chi-square test on a small vocabulary)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterator

import pytest

from llamafleet.engine.engine import Engine  # isort: skip  (llama.cpp before numpy: see engine/llama.py)

from fake_context import FakeContext, install

from llamafleet.engine.speculative.settings import SpeculativeConfig
from llamafleet.engine.types import EngineConfig, Generation, Request, SamplingParams
from llamafleet.model.demo import default_model_path

WORDS = [" red", " green", " blue", " cat", " dog", " sun"]
NGRAM = SpeculativeConfig(mode="ngram", max_draft=6, max_batch=64, draft_cost=0.0)  # the fake's time says nothing


def make(spec: bool, n_batch: int = 64, n_seq: int = 8) -> Engine:
    cfg = EngineConfig(model_path=str(default_model_path(progress=False)), n_seq=n_seq, n_ctx_per_seq=256,
                       n_batch=n_batch, speculative=NGRAM if spec else SpeculativeConfig())
    return Engine(cfg)


@pytest.fixture(scope="module")
def vocab() -> Iterator[list[int]]:
    with make(False) as eng:
        ids = [eng.tokenize(w, add_special=False) for w in WORDS]
    assert all(len(i) == 1 for i in ids), ids
    yield [i[0] for i in ids]


def prompts(vocab: list[int]) -> list[tuple[int, ...]]:
    """Prompts with repeated stretches, so prompt lookup finds drafts from the first answer token on."""
    a, b, c, d, e, f = vocab
    return [(a, b, c, d, a, b, c, d, a, b), (e, f, e, f, a, e, f, e), (c, c, d, a, b, f, c, c, d, a, b),
            (f, e, d, c, b, a, f, e, d), (a, a, a, a, b, a, a)]


def run(spec: bool, vocab: list[int], reqs: list[Request], n_batch: int = 64) -> tuple[dict[str, Generation], Engine]:
    with make(spec, n_batch) as eng:
        install(eng, vocab)
        got = eng.generate(reqs)
    return got, eng


def same(a: Generation, b: Generation, logprobs: bool) -> None:
    assert a.token_ids == b.token_ids
    assert a.text == b.text
    assert (a.finish_reason, a.completion_tokens) == (b.finish_reason, b.completion_tokens)
    if not logprobs:  # (a step's logprobs come for every sequence when one asks; only asked ones are compared)
        return
    assert len(a.logprobs) == len(a.token_ids)
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert [[t for t, _ in top] for top in a.top_logprobs] == [[t for t, _ in top] for top in b.top_logprobs]


PARAMS = {
    "greedy": SamplingParams(max_tokens=40, temperature=0.0),
    "greedy-logprobs": SamplingParams(max_tokens=30, temperature=0.0, logprobs=True, top_logprobs=3),
    "max-tokens": SamplingParams(max_tokens=7, temperature=0.0),
    "stop": SamplingParams(max_tokens=40, temperature=0.0, stop=(" cat dog", " sun sun")),
    "penalties": SamplingParams(max_tokens=40, temperature=0.0, repeat_penalty=1.3, presence_penalty=0.5),
    "bias": SamplingParams(max_tokens=40, temperature=0.0, logit_bias=((0, 0.0),)),
    "grammar": SamplingParams(max_tokens=40, temperature=0.0, grammar='root ::= (" red" | " cat" | " dog")+'),
    "sampled": SamplingParams(max_tokens=40, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7),
    "sampled-truncated": SamplingParams(max_tokens=40, temperature=0.7, top_k=4, top_p=0.9, seed=11, logprobs=True),
}


@pytest.mark.parametrize("n_batch", [64, 9])
def test_answers_with_prompt_lookup_equal_answers_without_token_for_token(vocab: list[int], n_batch: int) -> None:
    reqs = [Request(f"{name}-{i}", p, params) for name, params in PARAMS.items()
            for i, p in enumerate(prompts(vocab))]
    # the bias names a token of the small vocabulary, so it changes the answers
    reqs = [dataclasses.replace(r, params=dataclasses.replace(r.params, logit_bias=((vocab[3], 1.5),)))
            if r.params.logit_bias else r for r in reqs]
    plain, _ = run(False, vocab, reqs, n_batch)
    fast, eng = run(True, vocab, reqs, n_batch)
    for r in reqs:
        same(fast[r.request_id], plain[r.request_id], r.params.logprobs)
    stats = eng.stats()
    assert stats.draft_tokens_total > stats.draft_accepted_total > 0  # drafts were kept, and some rejected
    ctx = eng.ctx
    assert isinstance(ctx, FakeContext)
    drafted = sum(g.drafted_tokens for g in fast.values())
    assert drafted == stats.draft_tokens_total and sum(g.accepted_tokens for g in fast.values()) == \
        stats.draft_accepted_total
    assert all(g.drafted_tokens == 0 for g in plain.values())


def test_a_request_that_opts_out_drafts_nothing(vocab: list[int]) -> None:
    p = dataclasses.replace(PARAMS["greedy"], speculative=False)
    got, eng = run(True, vocab, [Request("out", prompts(vocab)[0], p)])
    assert got["out"].drafted_tokens == 0 and eng.stats().draft_tokens_total == 0
    assert len(got["out"].token_ids) == 40


def test_streaming_stays_one_token_per_output(vocab: list[int]) -> None:
    with make(True) as eng:
        install(eng, vocab)
        eng.add_request(Request("s", prompts(vocab)[0], PARAMS["greedy"]))
        outs = []
        while eng.has_work():
            outs += eng.step()
    assert all(len(o.token_ids) <= 1 for o in outs)
    assert sum(len(o.token_ids) for o in outs) == 40 and outs[-1].finished
    assert eng.stats().draft_accepted_total > 0
    assert eng.stats().steps < 40  # kept drafts made several tokens in one step


def chi_square_limit(df: int, z: float = 3.09) -> float:
    """The chi-square value exceeded with probability ~0.001 (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_sampled_answers_keep_the_target_distribution(vocab: list[int]) -> None:
    small = vocab[:4]
    a, b, c, d = small
    prompt = (a, b, c, a, b, c, a, b)  # prompt lookup drafts " c a b ..." from the first answer token
    n, length = 2000, 3
    params = [SamplingParams(max_tokens=length, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=i)
              for i in range(n)]
    with make(True, n_batch=256, n_seq=32) as eng:
        fake = install(eng, small, scale=1.0)
        got = eng.generate([Request(f"r{i}", prompt, p) for i, p in enumerate(params)])
    stats = eng.stats()
    kept, rejected = stats.draft_accepted_total, stats.draft_tokens_total - stats.draft_accepted_total
    assert kept > 100 and rejected > 100  # both branches of the rule ran, many times
    seen = Counter(tuple(g.token_ids) for g in got.values())
    expected: dict[tuple[int, ...], float] = {}
    for x in small:
        for y in small:
            for z in small:
                h = list(prompt)
                p = 1.0
                for t in (x, y, z):
                    p *= fake.probs(h)[small.index(t)]
                    h.append(t)
                expected[(x, y, z)] = p * n
    assert sum(seen.values()) == n and set(seen) <= set(expected)
    # cells expected fewer than 5 times are pooled into one, as a chi-square test requires
    big = [k for k, e in expected.items() if e >= 5]
    stat = sum((seen[k] - expected[k]) ** 2 / expected[k] for k in big)
    rest_e = sum(e for k, e in expected.items() if k not in big)
    rest_o = sum(seen[k] for k in expected if k not in big)
    cells = len(big)
    if rest_e > 0:
        stat += (rest_o - rest_e) ** 2 / rest_e
        cells += 1
    assert stat < chi_square_limit(cells - 1), (stat, cells)
