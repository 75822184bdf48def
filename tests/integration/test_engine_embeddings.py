"""The engine's embeddings against llama.cpp's own pooling, in-process: the demo model (mean over chunked passes,
beside a running generation) and a synthetic BERT model (an encoder, its own pooling, no generating).

The reference is llama-cpp-python's ``Llama.embed`` with llama.cpp pooling the whole input in one batch; the engine
pools unpooled hidden states itself, over passes of a few tokens, so agreement checks both the pooling and the
chunking (each chunk attends to the KV the previous ones left).
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from gguf import PoolingType

from llamafleet.engine.engine import Engine
from llamafleet.engine.types import EmbeddingRequest, EngineConfig, Generation, Request, SamplingParams
from llamafleet.model.synth_bert import write_bert

TEXTS = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog " * 6, "hello world"]


def reference(path: Path, texts: list[str], pooling: int = llama_cpp.LLAMA_POOLING_TYPE_MEAN) -> np.ndarray:
    """llama.cpp's pooled, normalised embeddings, each input in one batch."""
    llm = llama_cpp.Llama(str(path), embedding=True, pooling_type=pooling, n_ctx=512,
                          n_batch=512, n_ubatch=512, n_threads=1, verbose=False)
    try:
        return np.array([llm.embed(t, normalize=True) for t in texts], dtype=np.float64)
    finally:
        llm.close()


def run(engine: Engine, texts: list[str], rid: str = "e") -> np.ndarray:
    engine.add_embedding(EmbeddingRequest(rid, tuple(tuple(engine.tokenize(t)) for t in texts)))
    outs = []
    while engine.has_work():
        outs += [o for o in engine.step() if o.request_id == rid]
    assert outs[-1].finished and outs[-1].finish_reason == "stop", outs[-1]
    assert outs[-1].embeddings is not None
    return np.array([np.frombuffer(v, "<f4") for v in outs[-1].embeddings], dtype=np.float64)


def test_mean_pooling_over_chunks_matches_llama_cpp_beside_a_generation(model_path: Path) -> None:
    # passes of 16 tokens: the long input is embedded over several steps while an answer is generated
    cfg = EngineConfig(str(model_path), n_seq=2, n_ctx_per_seq=256, n_batch=16, n_ubatch=16, n_threads=1)
    with Engine(cfg) as engine:
        engine.add_request(Request("g", tuple(engine.tokenize("Once upon a time")),
                                   SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)))
        gen = Generation("g")
        engine.add_embedding(EmbeddingRequest("e", tuple(tuple(engine.tokenize(t)) for t in TEXTS)))
        vectors = None
        while engine.has_work():
            for out in engine.step():
                if out.request_id == "g":
                    gen.add(out)
                else:
                    vectors = np.array([np.frombuffer(v, "<f4") for v in out.embeddings or []])
        assert gen.finish_reason == "length" and gen.completion_tokens == 12  # the answer ran to its end
        assert vectors is not None and vectors.shape == (3, 576)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        cosine = np.sum(vectors * reference(model_path, TEXTS), axis=1)
        assert (cosine > 0.999).all(), cosine
        again = run(engine, TEXTS[:1], "again")  # alone: the same batches as the first, so the same vector
        assert np.array_equal(again[0], run(engine, TEXTS[:1], "again2")[0])


@pytest.mark.parametrize("pooling", [PoolingType.MEAN, PoolingType.CLS])
def test_an_encoder_model_embeds_with_its_own_pooling_and_refuses_to_generate(tmp_path: Path,
                                                                               pooling: PoolingType) -> None:
    path = write_bert(tmp_path / "bert.gguf", pooling=pooling)
    with Engine(EngineConfig(str(path), n_seq=2, n_ctx_per_seq=512, n_threads=1)) as engine:
        assert not engine.model.causal
        texts = ["hello world", "the cat sat on the mat", "hello world"]
        vectors = run(engine, texts)
        assert np.array_equal(vectors[0], vectors[2]) and not np.allclose(vectors[0], vectors[1])
        cosine = np.sum(vectors * reference(path, texts, int(pooling)), axis=1)
        assert (cosine > 0.9999).all(), cosine
        with pytest.raises(ValueError, match="embedding model"):
            engine.add_request(Request("g", tuple(engine.tokenize("hello")), SamplingParams(max_tokens=4)))
        with pytest.raises(ValueError, match="exceeds the context") as caught:  # its position table ends at 128
            engine.add_embedding(EmbeddingRequest("long", (tuple(engine.tokenize("hello " * 200)),)))
        assert caught.value.n_ctx == 128  # type: ignore[attr-defined]


def test_passes_shrink_to_a_quarter_while_answers_are_generated(model_path: Path) -> None:
    cfg = EngineConfig(str(model_path), n_seq=2, n_ctx_per_seq=256, n_batch=64, n_ubatch=64, n_threads=1)
    with Engine(cfg) as engine:
        tokens = tuple(engine.tokenize("words about things " * 40))[:64]

        def steps_to_embed() -> int:
            engine.add_embedding(EmbeddingRequest("e", (tokens,)))
            steps = 1
            while not any(o.request_id == "e" for o in engine.step()):
                steps += 1
            return steps

        assert steps_to_embed() == 1  # alone: one pass of 64 tokens
        engine.add_request(Request("g", tuple(engine.tokenize("Once upon a time")),
                                   SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)))
        engine.step()
        assert steps_to_embed() == 4  # beside an answer: passes of 16 tokens
        engine.abort("g")
        while engine.has_work():
            engine.step()


def test_an_aborted_request_ends_cancelled_and_leaves_the_others(model_path: Path) -> None:
    cfg = EngineConfig(str(model_path), n_seq=2, n_ctx_per_seq=256, n_batch=16, n_ubatch=16, n_threads=1)
    with Engine(cfg) as engine:
        long = tuple(engine.tokenize("words about things " * 20))
        engine.add_embedding(EmbeddingRequest("gone", (long, long)))
        engine.add_embedding(EmbeddingRequest("kept", (long[:5],)))
        ends = {o.request_id: o for o in engine.step()}
        engine.abort("gone")  # mid-way: its first input is half embedded
        while engine.has_work():
            ends |= {o.request_id: o for o in engine.step() if o.finished}
        assert ends["gone"].finish_reason == "cancelled" and ends["gone"].embeddings is None
        assert ends["kept"].finish_reason == "stop" and ends["kept"].embeddings is not None
        assert np.array_equal(run(engine, ["x"], "after")[0], run(engine, ["x"], "after2")[0])
