"""The torch engine's decode steps in fixed shapes (engine/pytorch/graphs.py), on the CPU: padded to batch and key
buckets they give the eager pass's greedy tokens; a capture that fails (here: no CUDA) falls back to eager steps
with one warning, the answers unchanged. (The capture itself needs a CUDA device: scripts/gpu-bench.sh torch.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from hf_models import tiny_checkpoint  # noqa: F401  (the session fixture)
from llamafleet.engine.pytorch.engine import TorchEngine
from llamafleet.engine.pytorch.graphs import StaticDecode, bucket_of, buckets
from llamafleet.engine.types import EngineConfig, Request, SamplingParams

PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time", "中国的首都是", "def f(x):",
           "Hello", " ".join(str(i) for i in range(120))]  # the last one: some 250 tokens


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> Iterator[TorchEngine]:  # noqa: F811
    cfg = EngineConfig(model_path=str(tiny_checkpoint), engine="torch", n_seq=6, n_ctx_per_seq=512, n_batch=512,
                       prefill_tokens=256, n_threads=1)
    with TorchEngine(cfg) as eng:
        yield eng


def answers(eng: TorchEngine, groups: list[list[int]], max_tokens: int) -> dict[str, tuple[list[int], list[float]]]:
    """Greedy answers of PROMPTS with their tokens' logprobs, the groups of prompt indexes run one after another
    (each group at once)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=True)
    out = {}
    for n, g in enumerate(groups):
        got = eng.generate([Request(f"{n}.{i}", tuple(eng.tokenize(PROMPTS[i])), params) for i in g])
        out |= {k: (v.token_ids, v.logprobs) for k, v in got.items()}
    return out


def same(a: dict[str, tuple[list[int], list[float]]], b: dict[str, tuple[list[int], list[float]]]) -> None:
    """The same tokens, and logprobs equal but for the float rounding of another batch shape."""
    assert {k: t for k, (t, _) in a.items()} == {k: t for k, (t, _) in b.items()}
    for k, (_, lp) in a.items():
        assert max(abs(x - y) for x, y in zip(lp, b[k][1], strict=True)) < 1e-5, k


def test_buckets() -> None:
    assert buckets(6, 1) == [1, 2, 4, 6] and buckets(8, 1) == [1, 2, 4, 8] and buckets(1, 1) == [1]
    assert buckets(1280, 256) == [256, 512, 1024, 1280]
    assert [bucket_of(n, [1, 2, 4, 6]) for n in (1, 2, 3, 5, 6)] == [1, 2, 4, 6, 6]


def test_fixed_shapes_give_the_eager_tokens(engine: TorchEngine) -> None:
    """Alone (1 row), three at once (padded to 4 rows, the slots' KV gathered), five (padded to the 6 slots: rows
    are slots, the KV read in place, an idle slot writes at its spare position) and seven on six slots, with a
    prompt past 256 keys (the second key bucket)."""
    groups = [[0], [1, 2, 6], [6, 1, 2, 3, 4], [6, 0, 1, 2, 3, 4, 5]]
    assert engine.graphs is None  # the CPU runs eager steps
    eager = answers(engine, groups, 24)
    engine.graphs = StaticDecode(engine.net, capture=False)
    try:
        static = answers(engine, groups, 24)
        assert set(engine.graphs._shapes) >= {(1, 256), (4, 512), (6, 512)}
    finally:
        engine.graphs = None
    same(static, eager)
    assert engine.stats().graph_steps_total == 0
    warmed = StaticDecode(engine.net, capture=False)
    warmed.warm()  # what a GPU replica captures at load: every batch bucket at the key buckets up to 1024
    assert set(warmed._shapes) == {(b, k) for b in (1, 2, 4, 6) for k in (256, 512)}


def test_a_capture_that_fails_falls_back_to_eager_steps_with_one_warning(
        engine: TorchEngine, caplog: pytest.LogCaptureFixture) -> None:
    eager = answers(engine, [[0, 1], [2]], 8)
    engine.graphs = StaticDecode(engine.net, capture=True)  # on the CPU: torch.cuda.Stream() raises
    try:
        with caplog.at_level(logging.WARNING, logger="llamafleet.engine.pytorch.graphs"):
            engine.graphs.warm()  # as at load: the first capture fails
            fallen = answers(engine, [[0, 1], [2]], 8)
        assert engine.graphs.broken is not None and engine.graphs.replays == 0
    finally:
        engine.graphs = None
    same(fallen, eager)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "decode steps run eagerly" in warnings[0].getMessage()
