"""What only a torch replica answers: the features the torch engine does not implement refused with a 400 that names
the llama.cpp engine (through the SDK too, the replicas serving on), and the checkpoint's own tokenizer. On the torch
engine's shared server (tests/conftest.py; the API modules marked ``each_engine`` run there as well)."""

from __future__ import annotations

import httpx
import openai
import pytest

from conftest import FleetServer

ASK = [{"role": "user", "content": "Name three colours."}]


def test_the_checkpoints_tokenizer_gives_llama2s_ids(torch_fleet: FleetServer) -> None:
    ids = httpx.post(f"{torch_fleet.url}/tokenize", json={"content": "Hello world"}, timeout=30).json()["tokens"]
    assert ids == [15043, 3186]  # LLaMA-2's tokenizer, read from the checkpoint's tokenizer.json
    assert [m["id"] for m in httpx.get(f"{torch_fleet.url}/v1/models", timeout=30).json()["data"]] == ["tiny-hf"]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 4,
                              "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "x", "schema": {"type": "object"}}}}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "grammar": 'root ::= "a"'}),
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 4, "tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0, "echo": True, "logprobs": 0}),
    ("/v1/embeddings", {"input": "Hi"}),
    ("/infill", {"input_prefix": "def f(", "input_suffix": "):", "n_predict": 4}),
])
def test_what_the_torch_engine_does_not_implement_is_a_400_naming_llama_cpp(torch_fleet: FleetServer, path: str,
                                                                           body: dict[str, object]) -> None:
    r = httpx.post(f"{torch_fleet.url}{path}", json={"model": "tiny-hf", **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert "llama.cpp engine" in r.json()["error"]["message"]


def test_the_sdk_sees_the_refusal_and_the_replicas_keep_serving(torch_fleet: FleetServer) -> None:
    client, model = torch_fleet.client(), "tiny-hf"
    with pytest.raises(openai.BadRequestError, match="llama.cpp engine"):
        client.chat.completions.create(model=model, messages=ASK, max_tokens=4,
                                       response_format={"type": "json_object"})
    assert client.completions.create(model=model, prompt="Hi", max_tokens=2).usage is not None
    metrics = httpx.get(f"{torch_fleet.url}/metrics", timeout=30).text
    assert "llamafleet_" in metrics and torch_fleet.ready()[0] == 200
