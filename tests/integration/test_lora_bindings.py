"""LoRA adapters through llamafleet's bindings, on a synthetic tiny model and adapters ``synth`` writes for it: a scale
of zero is the base model token for token, a nonzero scale changes the logits, and two adapters set in turn on one
context before each group's decode (llama.cpp applies adapters per context, not per sequence) give each sequence
what it gets alone with its adapter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from llamafleet.cli import main
from llamafleet.engine.llama import Batch, Context, Model
from llamafleet.engine.llama_lora import LoraAdapter, set_adapters
from llamafleet.engine.types import EngineConfig
from llamafleet.model.synth import SHAPES, find_vocab, write_model

PROMPT = [1, 450, 4996, 17354, 1701, 432, 17204, 975]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("lora")
    base = write_model(folder / "tiny.gguf", SHAPES["tiny"], "q8_0", find_vocab(), progress=False)
    out = {"base": base}
    for name, seed in (("a", 1), ("b", 2)):
        out[name] = folder / f"lora-{name}.gguf"
        assert main(["synth", "--lora-for", str(base), "--seed", str(seed), "-o", str(out[name])]) == 0
    return out


@pytest.fixture(scope="module")
def loaded(files: dict[str, Path]) -> Iterator[tuple[Context, Batch, dict[str, LoraAdapter]]]:
    cfg = EngineConfig(str(files["base"]), n_seq=2, n_ctx_per_seq=64, n_batch=64, n_threads=1)
    with Model(cfg) as model, Context(model, cfg) as ctx, Batch(64) as batch:
        adapters = {k: LoraAdapter(model, str(files[k])) for k in ("a", "b")}
        yield ctx, batch, adapters
        for a in adapters.values():
            a.close()


def decode(ctx: Context, batch: Batch, seqs: dict[int, list[int]], start: int) -> dict[int, np.ndarray]:
    """Each sequence's tokens from position ``start`` in one decode; the logits of each one's last token."""
    n = 0
    for seq, tokens in seqs.items():
        for i, t in enumerate(tokens):
            batch.token[n], batch.pos[n], batch.seq[n] = t, start + i, seq
            batch.logits[n] = i == len(tokens) - 1
            n += 1
    batch.n_tokens = n
    assert ctx.launch(batch) == 0
    ctx.wait()
    rows = ctx.logits(len(seqs)).copy()
    return dict(zip(seqs, rows, strict=True))


def greedy(ctx: Context, batch: Batch, adapters: list[tuple[LoraAdapter, float]], n: int = 8) -> tuple[list[int],
                                                                                                      np.ndarray]:
    """``n`` greedy tokens after PROMPT on sequence 0 with ``adapters``; and the prompt's last logits."""
    ctx.clear_all()
    set_adapters(ctx, adapters)
    first = logits = decode(ctx, batch, {0: PROMPT}, 0)[0]
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = decode(ctx, batch, {0: out[-1:]}, len(PROMPT) + len(out) - 1)[0]
    return out, first


def test_scale_zero_is_the_base_model_and_nonzero_changes_the_logits(
        loaded: tuple[Context, Batch, dict[str, LoraAdapter]]) -> None:
    ctx, batch, lora = loaded
    base_tokens, base = greedy(ctx, batch, [])
    zero_tokens, zero = greedy(ctx, batch, [(lora["a"], 0.0)])
    assert zero_tokens == base_tokens and np.array_equal(zero, base)
    _, scaled = greedy(ctx, batch, [(lora["a"], 1.0)])
    assert np.abs(scaled - base).max() > 1e-2
    _, other = greedy(ctx, batch, [(lora["b"], 1.0)])
    assert np.abs(other - scaled).max() > 1e-2
    assert greedy(ctx, batch, [])[0] == base_tokens  # adapters off again: the base model


def test_two_adapters_in_one_step_grouped_per_decode(loaded: tuple[Context, Batch, dict[str, LoraAdapter]]) -> None:
    ctx, batch, lora = loaded
    alone = {name: greedy(ctx, batch, [(lora[name], 1.0)])[1] for name in ("a", "b")}
    ctx.clear_all()
    set_adapters(ctx, [(lora["a"], 1.0)])  # one step, two groups: sequence 0 with a, then sequence 1 with b
    got_a = decode(ctx, batch, {0: PROMPT}, 0)[0]
    set_adapters(ctx, [(lora["b"], 1.0)])
    got_b = decode(ctx, batch, {1: PROMPT}, 0)[1]
    np.testing.assert_allclose(got_a, alone["a"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_b, alone["b"], rtol=1e-4, atol=1e-4)
    set_adapters(ctx, [])
