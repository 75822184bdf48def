"""Speculative decoding on the real model (SmolLM2-135M-Instruct, CPU): how often greedy answers with prompt lookup
differ from answers without it, and why.

Verifying drafts feeds a sequence several tokens in one pass where a plain step feeds one: the same batch-cut
numerics that tests/integration/test_prefix_cache.py documents for prefix reuse. A near-tie between the two best
tokens can then flip; nothing else may. So every answer that differs must differ first at a token whose two best
logits (in the answer without speculation) are within a small gap, and the numbers are printed for the report.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llamafleet.engine.engine import Engine  # isort: skip  (llama.cpp before numpy: see engine/llama.py)

from llamafleet.bench.workloads import edit_prompt, extract_prompt
from llamafleet.engine.speculative.settings import SpeculativeConfig
from llamafleet.engine.types import EngineConfig, Generation, Request, SamplingParams

NEAR_TIE = 0.5  # logits: the widest gap between the two best tokens that batch-cut numerics were seen to flip
QUESTIONS = ["def fibonacci(n):", "List the days of the week: Monday, Tuesday,",
             "Count from one to twenty: one, two, three,"]


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[Engine]:
    cfg = EngineConfig(model_path=str(model_path), n_seq=1, n_ctx_per_seq=1024, n_batch=256, n_threads=1,
                       speculative=SpeculativeConfig(mode="ngram", max_draft=8, draft_cost=0.0))  # draft always
    with Engine(cfg) as eng:
        yield eng


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def test_greedy_answers_with_prompt_lookup_differ_only_at_near_ties(engine: Engine) -> None:
    texts = [edit_prompt(i).text for i in range(2)] + [extract_prompt(0).text] + QUESTIONS
    report = []
    drafted = 0
    for i, text in enumerate(texts):
        got: dict[bool, Generation] = {}
        for spec in (False, True):
            params = SamplingParams(max_tokens=48, temperature=0.0, logprobs=True, top_logprobs=2, speculative=spec)
            rid = f"{i}-{spec}"
            got[spec] = engine.generate([Request(rid, tuple(engine.tokenize(text)), params)])[rid]
        drafted += got[True].drafted_tokens
        at = first_difference(got[False].token_ids, got[True].token_ids)
        if at is None:
            report.append((i, None, None))
            continue
        top = got[False].top_logprobs[at]
        gap = top[0][1] - top[1][1]  # logprobs of one row differ as its logits do
        report.append((i, at, gap))
    print("\nprompt, first differing token, gap between the two best logits there:", report)
    assert drafted > 0
    same = sum(1 for _, at, _ in report if at is None)
    assert same >= len(texts) // 2, report
    assert all(gap < NEAR_TIE for _, at, gap in report if at is not None), report
