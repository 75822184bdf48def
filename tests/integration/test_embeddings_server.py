"""``POST /v1/embeddings`` on real servers with the OpenAI SDK: the shared demo-model server (a generative model's
mean-pooled hidden states) and a server of a synthetic BERT model (an embedding model, which refuses to generate)."""

from __future__ import annotations

import base64
import resource
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import llama_cpp
import numpy as np
import openai
import pytest
from openai import OpenAI

from conftest import FleetServer
from llamafleet.model.synth_bert import write_bert

N_EMBD = 576  # the demo model's hidden size


def vectors(response: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.array([d.embedding for d in response.data], dtype=np.float64)


def test_text_lists_and_token_ids_in_both_encodings(client: OpenAI, model: str, model_path: Path) -> None:
    one = client.embeddings.create(model=model, input="The cat sat on the mat.")  # the SDK asks for base64
    v = vectors(one)
    assert v.shape == (1, N_EMBD) and abs(np.linalg.norm(v[0]) - 1) < 1e-5
    assert one.model == model and one.usage.prompt_tokens == one.usage.total_tokens > 0
    floats = client.embeddings.create(model=model, input="The cat sat on the mat.", encoding_format="float")
    assert np.array_equal(vectors(floats), v)  # same input alone, same numbers, whichever replica and encoding

    many = vectors(client.embeddings.create(model=model, input=["The cat sat on the mat.", "Stock prices fell.",
                                                                 "The cat sat on the mat."]))
    assert many.shape == (3, N_EMBD)
    np.testing.assert_allclose(np.linalg.norm(many, axis=1), 1.0, atol=1e-5)
    assert many[0] @ many[2] > 0.9999 and many[0] @ v[0] > 0.9999  # packed into one pass with others: nearly equal
    assert many[0] @ many[1] < 0.99  # different texts, different vectors

    vocab = llama_cpp.Llama(str(model_path), vocab_only=True, verbose=False)
    ids = vocab.tokenize(b"The cat sat on the mat.", add_bos=True, special=False)
    by_ids = vectors(client.embeddings.create(model=model, input=ids))
    assert np.array_equal(by_ids, v)  # token ids are the same input as the text they spell
    both = vectors(client.embeddings.create(model=model, input=[ids, ids[:3]], encoding_format="float"))
    assert both.shape == (2, N_EMBD) and both[0] @ v[0] > 0.9999


def test_raw_body_shapes_and_refusals(fleet: FleetServer, model: str) -> None:
    url = f"{fleet.url}/v1/embeddings"
    r = httpx.post(url, json={"model": model, "input": "hi", "encoding_format": "base64", "user": "u", "dimensions":
                              N_EMBD}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["data"][0]["object"] == "embedding"
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert len(raw) == 4 * N_EMBD and abs(np.linalg.norm(np.frombuffer(raw, "<f4")) - 1) < 1e-5
    for bad, param in [({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [[]]}, "input"),
                       ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
                       ({"input": "hi", "dimensions": 256}, "dimensions"), ({"input": [-1]}, None)]:
        r = httpx.post(url, json={"model": model, **bad}, timeout=60)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["param"] == param, r.text
    assert httpx.post(url, json={"model": "nope", "input": "hi"}, timeout=60).status_code == 404


def test_an_input_past_the_context_is_a_400_in_openai_words(client: OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=model, input=["short", "the quick brown fox " * 200])
    err = caught.value
    assert err.code == "context_length_exceeded" and err.param == "input"
    assert "This model's maximum context length is 512 tokens, however you requested" in err.message
    assert vectors(client.embeddings.create(model=model, input="still serving")).shape == (1, N_EMBD)


def test_embeddings_beside_streamed_chats(fleet: FleetServer, client: OpenAI, model: str) -> None:
    texts: list[str] = []
    embedded: list[np.ndarray] = []
    errors: list[BaseException] = []

    def chat() -> None:
        try:
            stream = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Count from one to twenty."}], max_tokens=24,
                temperature=0, stream=True, extra_body={"ignore_eos": True})
            texts.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def embed(i: int) -> None:
        try:
            inputs = [f"document {i} part {j}: " + "words about things " * (3 + 5 * j) for j in range(4)]
            embedded.append(vectors(client.embeddings.create(model=model, input=inputs)))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=chat) for _ in range(4)] + [
        threading.Thread(target=embed, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert len(texts) == 4 and all(t for t in texts)
    assert len(embedded) == 4 and all(e.shape == (4, N_EMBD) for e in embedded)
    metrics = httpx.get(f"{fleet.url}/metrics", timeout=30).text
    counted = [line for line in metrics.splitlines() if line.startswith("llamafleet_embedding_inputs_total")]
    assert counted and float(counted[0].split()[-1]) >= 16


@pytest.fixture(scope="module")
def bert(launch_fleet: Callable[[list[str]], FleetServer], tmp_path_factory: pytest.TempPathFactory) -> FleetServer:
    path = write_bert(tmp_path_factory.mktemp("bert") / "tiny-bert.gguf")
    server = launch_fleet(["--model", str(path), "--replicas", "1", "--parallel", "2", "--ctx", "128",
                           "--threads", "1"])
    server.wait_ready()
    return server


def test_an_embedding_model_embeds_and_refuses_to_generate(bert: FleetServer) -> None:
    client, model = bert.client(), bert.model()
    v = vectors(client.embeddings.create(model=model, input=["hello world", "the cat sat on the mat",
                                                             "hello world"]))
    assert v.shape == (3, 64) and np.array_equal(v[0], v[2]) and v[0] @ v[1] < 0.99
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.completions.create(model=model, prompt="hello", max_tokens=4)
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=model, input="hello " * 200)  # its position table ends at 128 tokens
    assert caught.value.code == "context_length_exceeded"
    assert np.array_equal(vectors(client.embeddings.create(model=model, input="hello world"))[0], v[0])
    assert bert.ready()[0] == 200


def test_an_embedding_context_that_cannot_be_created_is_a_503_and_the_replica_keeps_serving(
        launch_fleet: Callable[[list[str]], FleetServer], model_path: Path) -> None:
    """The embedding context is created on the first embedding request, beside the model's own. When its memory is
    not there (here: the worker's address space capped just above what it uses), that request gets a 503 that says
    why, and chats and later embeddings (once memory is back) are served by the same replica."""
    server = launch_fleet(["--model", str(model_path), "--replicas", "1", "--parallel", "2", "--ctx", "2048",
                           "--threads", "1"])
    (replica,) = server.wait_ready()["replicas"]
    pid = replica["pid"]
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    _, hard = resource.prlimit(pid, resource.RLIMIT_AS)
    resource.prlimit(pid, resource.RLIMIT_AS, (size + (16 << 20), hard))  # no room for a 2048-token context
    try:
        refused = httpx.post(f"{server.url}/v1/embeddings", json={"model": server.model(), "input": "hello"},
                             timeout=60)
    finally:
        resource.prlimit(pid, resource.RLIMIT_AS, (hard, hard))
    assert refused.status_code == 503, refused.text
    assert "cannot compute embeddings now" in refused.json()["error"]["message"]
    client = server.client()
    answer = client.chat.completions.create(model=server.model(), max_tokens=4,
                                            messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert vectors(client.embeddings.create(model=server.model(), input="hello")).shape == (1, N_EMBD)
    assert server.ready()[1]["replicas"][0]["pid"] == pid  # the same worker all along
