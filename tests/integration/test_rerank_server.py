"""``POST /v1/rerank`` (and its other names) on a real server of two synthetic BERT models: a reranker and an embedding
model. The request shapes llama-server's, Jina's, Cohere's and TEI's clients send; scores against llama-cpp-python's
own scoring of the same pairs (:mod:`llama_rerank`); the refusals: a model that cannot rerank (naming the one that
can), a reranker asked for embeddings or text, bad bodies, a pair past the model's context."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from gguf import PoolingType
from llama_rerank import scores

from conftest import FleetServer
from llamafleet.model.synth_bert import write_bert

QUERY = "is the cat on the mat"
DOCS = ["hello world", "the cat sat on the mat", "the dog is on the mat", "x 1 2 3"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("rerank")
    return {"ranker": write_bert(folder / "ranker.gguf", pooling=PoolingType.RANK, seed=1),
            "embedder": write_bert(folder / "embedder.gguf")}


@pytest.fixture(scope="module")
def server(launch_fleet: Callable[[list[str]], FleetServer], models: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> FleetServer:
    config = tmp_path_factory.mktemp("rerank-config") / "fleet.yaml"
    config.write_text("parallel: 2\ncontext_length: 128\nthreads: 1\nmodels:\n"
                      f"  - {{name: embedder, path: {models['embedder']}}}\n"  # loaded on demand
                      f"  - {{name: ranker, path: {models['ranker']}, pinned: true}}\n", encoding="utf-8")
    fleet = launch_fleet(["--config", str(config)])
    fleet.wait_ready()
    return fleet


def post(server: FleetServer, body: dict[str, Any], route: str = "/v1/rerank") -> httpx.Response:
    return httpx.post(f"{server.url}{route}", json=body, timeout=60)


def test_scores_sorted_and_equal_to_llama_cpp_on_every_route(server: FleetServer, models: dict[str, Path]) -> None:
    expected, pairs = scores(models["ranker"], QUERY, DOCS)
    order = sorted(range(len(DOCS)), key=lambda i: -expected[i])
    for route in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking"):
        r = post(server, {"model": "ranker", "query": QUERY, "documents": DOCS}, route)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == "ranker" and body["object"] == "list"
        assert [x["index"] for x in body["results"]] == order
        assert [x["relevance_score"] for x in body["results"]] == pytest.approx([expected[i] for i in order],
                                                                                rel=1e-4)
        assert all("document" not in x for x in body["results"])
        assert body["usage"] == {"prompt_tokens": sum(map(len, pairs)), "total_tokens": sum(map(len, pairs))}


def test_client_shapes(server: FleetServer) -> None:
    # Jina / Cohere: documents as objects, top_n, return_documents; no model: the reranker is the one that answers
    r = post(server, {"query": QUERY, "documents": [{"text": d} for d in DOCS], "top_n": 2, "return_documents": True})
    assert r.status_code == 200, r.text
    top = r.json()["results"]
    assert len(top) == 2 and [x["document"]["text"] for x in top] == [DOCS[x["index"]] for x in top]
    assert top[0]["relevance_score"] >= top[1]["relevance_score"]
    # mixed strings and objects; top_n past the count gives all
    r = post(server, {"model": "ranker", "query": QUERY, "documents": [DOCS[0], {"text": DOCS[1]}], "top_n": 10})
    assert r.status_code == 200 and len(r.json()["results"]) == 2
    # TEI: texts in, a bare list of {index, score[, text]} out
    r = post(server, {"query": QUERY, "texts": DOCS, "return_text": True}, "/rerank")
    assert r.status_code == 200, r.text
    tei = r.json()
    assert isinstance(tei, list) and len(tei) == len(DOCS) and all(DOCS[x["index"]] == x["text"] for x in tei)
    assert [x["score"] for x in tei] == sorted((x["score"] for x in tei), reverse=True)


def states(server: FleetServer) -> dict[str, str]:
    return {m["id"]: m["state"] for m in httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]}


def test_refusals(server: FleetServer) -> None:
    r = post(server, {"model": "embedder", "query": QUERY, "documents": DOCS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "cannot rerank" in r.text and "'ranker'" in r.text
    assert states(server)["embedder"] == "unloaded"  # its header said so: refused without loading it
    r = httpx.post(f"{server.url}/v1/embeddings", json={"model": "ranker", "input": "hello"}, timeout=60)
    assert r.status_code == 400 and "reranker" in r.text
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "ranker", "prompt": "hello", "max_tokens": 2},
                   timeout=60)
    assert r.status_code == 400 and "reranker" in r.text and "/v1/rerank" in r.text
    for bad, param in [({"documents": []}, "documents"), ({}, None), ({"documents": DOCS, "texts": DOCS}, None),
                       ({"documents": DOCS, "top_n": 0}, "top_n"), ({"documents": [1]}, "documents"),
                       ({"documents": [{"title": "t"}]}, "documents"),
                       ({"documents": DOCS, "rank_fields": ["a"]}, "rank_fields")]:
        r = post(server, {"model": "ranker", "query": QUERY, **bad})
        assert r.status_code == 400, (bad, r.text)
        assert param is None or (r.json()["error"]["param"] or "").startswith(param), (bad, r.text)
    surrogate = httpx.post(f"{server.url}/v1/rerank", content=b'{"query": "q", "documents": ["a\\ud800"]}',
                           headers={"Content-Type": "application/json"}, timeout=60)
    assert surrogate.status_code == 400 and "surrogate" in surrogate.text
    assert post(server, {"model": "nope", "query": QUERY, "documents": DOCS}).status_code == 404
    r = post(server, {"model": "ranker", "query": QUERY, "documents": ["short", "the cat " * 80]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert post(server, {"model": "ranker", "query": QUERY, "documents": DOCS}).status_code == 200


def test_concurrent_requests_beside_embeddings(server: FleetServer) -> None:
    alone = {x["index"]: x["relevance_score"] for x in post(server, {"query": QUERY, "documents": DOCS}).json()[
        "results"]}
    answers: list[dict[int, float]] = []
    errors: list[str] = []

    def one() -> None:
        r = post(server, {"query": QUERY, "documents": DOCS * 3})
        if r.status_code != 200:
            errors.append(r.text)
        else:
            answers.append({x["index"]: x["relevance_score"] for x in r.json()["results"]})

    def embed() -> None:
        r = httpx.post(f"{server.url}/v1/embeddings", json={"model": "embedder", "input": DOCS}, timeout=60)
        if r.status_code != 200:
            errors.append(r.text)

    threads = [threading.Thread(target=one) for _ in range(4)] + [threading.Thread(target=embed) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(answers) == 4
    for got in answers:
        assert [got[i] for i in range(len(DOCS) * 3)] == pytest.approx([alone[i % len(DOCS)]
                                                                        for i in range(len(DOCS) * 3)], rel=1e-4)


def counters(server: FleetServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    names = ("llamafleet_rerank_pairs_total", "llamafleet_rerank_tokens_total", "llamafleet_embedding_inputs_total")
    return {n: sum(float(v) for v in re.findall(rf"^{n}(?:{{[^}}]*}})? (\S+)$", text, re.M)) for n in names}


def test_pairs_are_counted_apart_from_embeddings(server: FleetServer) -> None:
    before = counters(server)
    body = post(server, {"query": QUERY, "documents": DOCS}).json()
    assert httpx.post(f"{server.url}/v1/embeddings", json={"model": "embedder", "input": DOCS[:3]},
                      timeout=60).status_code == 200
    after = counters(server)
    assert after["llamafleet_rerank_pairs_total"] - before["llamafleet_rerank_pairs_total"] == len(DOCS)
    assert after["llamafleet_rerank_tokens_total"] - before["llamafleet_rerank_tokens_total"] == \
        body["usage"]["prompt_tokens"]
    assert after["llamafleet_embedding_inputs_total"] - before["llamafleet_embedding_inputs_total"] == 3
