"""Speculative decoding with a draft model (engine/speculative/draft_model.py).

Exactness on a deterministic target (tests/integration/fake_context.py): the draft model's context is a fake too,
the target's own (every draft kept) or a noisy copy of it (some kept, some rejected); the fake checks that every
token lands at the next free position of its slot, so a rejected draft whose KV was not given back fails the
next write, in the draft's context as in the target's. Then the real thing: the demo model with a tiny random
draft of its vocabulary (written by the synth module) and with itself as its draft, and a draft of another
vocabulary refused at load.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from llamafleet.engine.engine import Engine  # isort: skip  (llama.cpp before numpy: see engine/llama.py)

from fake_context import FakeContext, install
from test_speculative import PARAMS, prompts, same

from llamafleet.bench.workloads import edit_prompt
from llamafleet.engine.llama import Batch
from llamafleet.engine.llama_backend import quantize
from llamafleet.engine.speculative.draft_model import DraftModel, check_vocab
from llamafleet.engine.speculative.settings import SpeculativeConfig
from llamafleet.engine.types import EngineConfig, Generation, Request, SamplingParams
from llamafleet.model.header import read_model_info
from llamafleet.model.synth import SHAPES, find_vocab, write_model

WORDS = [" red", " green", " blue", " cat", " dog", " sun"]


@pytest.fixture(scope="module")
def drafts(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> dict[str, Path]:
    """A tiny random model with the demo model's vocabulary, and one with LLaMA-2's."""
    folder = tmp_path_factory.mktemp("drafts")
    return {"same": write_model(folder / "micro-smollm.gguf", SHAPES["micro"], "q8_0", model_path, progress=False),
            "other": write_model(folder / "micro-llama.gguf", SHAPES["micro"], "q8_0", find_vocab(), progress=False)}


def config(model_path: Path, draft: Path | None, **kw: object) -> EngineConfig:
    spec = SpeculativeConfig() if draft is None else SpeculativeConfig(
        mode="draft", draft_model=str(draft), max_draft=6, max_batch=64, draft_cost=0.0)
    return EngineConfig(**{"model_path": str(model_path), "n_seq": 8, "n_ctx_per_seq": 256, "n_batch": 64,
                           "n_threads": 1, "speculative": spec, **kw})  # type: ignore[arg-type]


class NoisyFake(FakeContext):
    """The fake target's logits plus noise keyed by the history: its greedy token is often the target's, not
    always."""

    def row(self, history: list[int]) -> npt.NDArray[np.float32]:
        rng = np.random.default_rng(zlib.crc32(repr(history[-3:]).encode()))
        r = super().row(history).copy()
        r[self.vocab] += rng.normal(0.0, 1.5, size=len(self.vocab))
        return r


@pytest.fixture(scope="module")
def vocab(model_path: Path) -> list[int]:
    with Engine(config(model_path, None)) as eng:
        ids = [eng.tokenize(w, add_special=False) for w in WORDS]
    return [i[0] for i in ids]


class Recording(FakeContext):
    """The fake target's logits; it records the size of every pass."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.sizes: list[int] = []

    def launch(self, batch: Batch) -> int:
        self.sizes.append(batch.n_tokens)
        return super().launch(batch)


def run_fake(model_path: Path, draft: Path | None, vocab: list[int], reqs: list[Request],
             fake: type[FakeContext] = FakeContext, **kw: Any) -> tuple[dict[str, Generation], Engine]:
    with Engine(config(model_path, draft, **kw)) as eng:
        install(eng, vocab)
        if draft is not None:
            assert eng.spec is not None and isinstance(eng.spec.source, DraftModel)
            d = eng.spec.source
            d.ctx.close()
            d.ctx = fake(d.model, 8, 256, vocab)
        return eng.generate(reqs), eng


@pytest.mark.parametrize("noisy", [False, True], ids=["draft-is-target", "noisy-draft"])
def test_answers_with_a_draft_model_equal_answers_without_token_for_token(
        model_path: Path, drafts: dict[str, Path], vocab: list[int], noisy: bool) -> None:
    reqs = [Request(f"{name}-{i}", p, params) for name in ("greedy", "greedy-logprobs", "stop", "max-tokens",
                                                           "penalties", "sampled", "grammar")
            for i, p in enumerate(prompts(vocab)) for params in [PARAMS[name]]]
    plain, _ = run_fake(model_path, None, vocab, reqs)
    fast, eng = run_fake(model_path, drafts["same"], vocab, reqs, NoisyFake if noisy else FakeContext)
    for r in reqs:
        same(fast[r.request_id], plain[r.request_id], r.params.logprobs)
    stats = eng.stats()
    greedy = [g for r, g in fast.items() if r.startswith("greedy-")]
    acceptance = sum(g.accepted_tokens for g in greedy) / max(1, sum(g.drafted_tokens for g in greedy))
    if noisy:
        assert stats.draft_tokens_total > stats.draft_accepted_total > 0  # some kept, some rejected and rolled back
        # (free drafts: always max_draft long, so a rejection early in one leaves most of it unkept)
        assert 0.1 < acceptance < 0.95, acceptance
    else:
        assert acceptance == 1.0  # the draft is the target: greedy drafts are all kept


def test_a_long_prompt_catches_up_in_the_draft_model_a_chunk_a_step(model_path: Path, drafts: dict[str, Path],
                                                                     vocab: list[int]) -> None:
    """A draft model prefills a new prompt at most prefill_tokens a step (as the model does), so one long prompt
    does not hold up every other sequence's step; the answers stay exact."""
    a, b, c, d, e, f = vocab
    reqs = [Request("long", (a, b, c, d, e, f, c, a) * 20, PARAMS["greedy"]),
            Request("short", prompts(vocab)[0], PARAMS["greedy"])]
    plain, _ = run_fake(model_path, None, vocab, reqs)
    fast, eng = run_fake(model_path, drafts["same"], vocab, reqs, Recording, prefill_tokens=40)
    for r in reqs:
        same(fast[r.request_id], plain[r.request_id], False)
    assert eng.spec is not None and isinstance(eng.spec.source.ctx, Recording)
    sizes = eng.spec.source.ctx.sizes
    # the long prompt's 160 tokens in chunks of 40; the short one (10 tokens and an answer's, under draft_model.LAG)
    # caught up whole beside a chunk
    assert max(sizes) <= 40 + 11 and sum(n >= 40 for n in sizes) >= 4, sizes
    assert fast["long"].drafted_tokens > 0 and fast["short"].drafted_tokens > 0


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


@pytest.fixture(scope="module")
def real(model_path: Path, drafts: dict[str, Path]) -> Iterator[dict[str, Engine]]:
    cfgs = {"off": config(model_path, None, n_seq=2, n_ctx_per_seq=1024, n_batch=256),
            "tiny": config(model_path, drafts["same"], n_seq=2, n_ctx_per_seq=1024, n_batch=256),
            "self": config(model_path, model_path, n_seq=2, n_ctx_per_seq=1024, n_batch=256)}
    engines = {k: Engine(c) for k, c in cfgs.items()}
    yield engines
    for e in engines.values():
        e.close()


def answer(eng: Engine, text: str, n: int = 40) -> Generation:
    params = SamplingParams(max_tokens=n, temperature=0.0, logprobs=True, top_logprobs=2)
    return eng.generate([Request("r", tuple(eng.tokenize(text)), params)])["r"]


@pytest.mark.parametrize("draft", ["tiny", "self"])
def test_the_demo_model_with_a_draft_answers_as_without_it(real: dict[str, Engine], draft: str) -> None:
    """Token for token, but for a near-tie flipped by the batch-cut numerics (tests/integration/
    test_speculative_model.py): then the two best logits were within 0.5 where the answers part."""
    texts = [edit_prompt(0).text, "List the days of the week: Monday, Tuesday,"]
    drafted = accepted = 0
    for text in texts:
        plain, fast = answer(real["off"], text), answer(real[draft], text)
        drafted, accepted = drafted + fast.drafted_tokens, accepted + fast.accepted_tokens
        at = first_difference(plain.token_ids, fast.token_ids)
        if at is not None:
            top = plain.top_logprobs[at]
            assert top[0][1] - top[1][1] < 0.5, (text, at, top)
    assert drafted > 0
    if draft == "self":  # the model drafting for itself: nearly every draft is kept (near-ties aside)
        assert accepted / drafted > 0.9, (accepted, drafted)


def test_the_draft_models_kv_follows_the_slot_across_requests(real: dict[str, Engine]) -> None:
    """A slot's next request starts the draft model from what the slot shares with it; drafts keep being kept."""
    eng = real["self"]
    before = eng.stats()
    for text in ["Count from one to ten: one, two,", "Count from one to ten: one, two, three,"]:
        answer(eng, text, 24)
    after = eng.stats()
    drafted = after.draft_tokens_total - before.draft_tokens_total
    assert drafted > 0 and (after.draft_accepted_total - before.draft_accepted_total) / drafted > 0.9


def test_a_draft_model_of_another_vocabulary_is_refused_at_load(model_path: Path, drafts: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"speculative.draft_model .*micro-llama.gguf: its vocabulary is not the "
                                         r"served model's \(it has 32000 tokens, the model 49152\)"):
        Engine(config(model_path, drafts["other"]))


def test_a_draft_model_with_one_token_changed_is_refused(model_path: Path, drafts: dict[str, Path]) -> None:
    with Engine(config(model_path, drafts["same"])) as eng:
        assert eng.spec is not None and isinstance(eng.spec.source, DraftModel)
        draft = eng.spec.source.model
        draft.pieces = list(draft.pieces)
        draft.pieces[1000] = b"changed"
        with pytest.raises(ValueError, match="token 1000 is b'changed' in it"):
            check_vocab(eng.model, draft, "d.gguf")


def test_a_quantized_copy_of_a_model_drafts_for_it(model_path: Path, drafts: dict[str, Path], tmp_path: Path) -> None:
    """llama.cpp's quantizer makes a smaller copy with the same vocabulary (how docs/BENCHMARKS.md's CPU draft was
    made from the demo model)."""
    out = tmp_path / "micro-q4_0.gguf"
    quantize(str(drafts["same"]), str(out), "q4_0")
    info = read_model_info(out)
    assert {t for t, _ in info.tensor_types} == {"Q4_0", "F32"}  # every matrix, the embedding too
    assert info.weights_bytes < read_model_info(drafts["same"]).weights_bytes
    with Engine(config(model_path, out)) as eng:
        assert eng.spec is not None and isinstance(eng.spec.source, DraftModel)  # its vocabulary passed the check


def test_speculation_settings_name_the_draft_model_key() -> None:
    with pytest.raises(ValueError, match="speculative.draft_model"):
        SpeculativeConfig(mode="draft")
    with pytest.raises(ValueError, match="speculative.draft_model"):
        dataclasses.replace(SpeculativeConfig(mode="ngram"), draft_model="x.gguf")
