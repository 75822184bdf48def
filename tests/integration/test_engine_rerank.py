"""The engine's reranking against llama.cpp's own scoring, in-process, on synthetic BERT rerankers (a classifier head,
pooling type rank): with and without a ``rerank`` template in the GGUF, pairs packed into one pass against each pair
scored alone by llama-cpp-python's low-level calls (:mod:`llama_rerank`); what a reranker and an embedding model
each refuse."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import PoolingType
from llama_rerank import scores

from llamafleet.engine.engine import Engine
from llamafleet.engine.types import EmbeddingRequest, EngineConfig, Request, SamplingParams
from llamafleet.model.synth_bert import write_bert

QUERY = "is the cat on the mat"
DOCS = ["the cat sat on the mat", "hello world", "the dog is on the mat", "x", "the cat sat on the mat"]


def run(engine: Engine, req: EmbeddingRequest) -> tuple[list[float], int]:
    engine.add_embedding(req)
    outs = []
    while engine.has_work():
        outs += engine.step()
    assert len(outs) == 1 and outs[0].finish_reason == "stop", outs
    return [struct.unpack_from("<f", v)[0] for v in outs[0].embeddings or []], outs[0].prompt_tokens


@pytest.mark.parametrize("template", [None, "[CLS] {query} [SEP] {document} [SEP]"])
def test_scores_match_llama_cpp_pair_by_pair(tmp_path: Path, template: str | None) -> None:
    path = write_bert(tmp_path / "reranker.gguf", pooling=PoolingType.RANK, rerank_template=template)
    expected, pairs = scores(path, QUERY, DOCS)
    with Engine(EngineConfig(str(path), n_seq=2, n_ctx_per_seq=128, n_threads=1)) as engine:
        assert engine.embedder.reranks and engine.model.n_cls_out == 1
        got_pairs = engine.embedder.pairs(QUERY, DOCS)
        assert [list(p) for p in got_pairs] == pairs  # laid out as llama-server lays them
        if template is not None:
            assert pairs[0][0] == 2 and pairs[0].count(3) == 2  # [CLS] and both [SEP]s parsed as special tokens
        got, n_tokens = run(engine, EmbeddingRequest("r", got_pairs, rank=True))
        assert n_tokens == sum(len(p) for p in pairs)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)  # five pairs in one pass, each alone there
        assert got[0] == pytest.approx(got[4], rel=1e-5) and len(set(got[:4])) == 4
        with pytest.raises(ValueError, match="reranker"):  # it gives no embeddings
            engine.add_embedding(EmbeddingRequest("e", got_pairs[:1]))
        with pytest.raises(ValueError, match="reranker .* cannot generate"):
            engine.add_request(Request("g", tuple(got_pairs[0]), SamplingParams(max_tokens=2)))
        long = engine.embedder.pairs(QUERY, ["the cat " * 80])
        with pytest.raises(ValueError, match="exceeds the context"):  # past BERT's position table (128)
            engine.add_embedding(EmbeddingRequest("long", long, rank=True))
        again, _ = run(engine, EmbeddingRequest("again", got_pairs[1:2], rank=True))
        assert again[0] == pytest.approx(got[1], rel=1e-4)


def test_an_embedding_model_refuses_to_rerank(tmp_path: Path) -> None:
    path = write_bert(tmp_path / "bert.gguf")
    with Engine(EngineConfig(str(path), n_seq=2, n_ctx_per_seq=128, n_threads=1)) as engine:
        assert not engine.embedder.reranks
        with pytest.raises(ValueError, match="not a reranker"):
            engine.add_embedding(EmbeddingRequest("r", engine.embedder.pairs(QUERY, DOCS[:1]), rank=True))
