"""The API on torch replicas: a real ``llamafleet serve`` of the tiny random checkpoint folder (2 replicas), through
the OpenAI and Anthropic SDKs. The answers are noise, so every check is one that holds for any model: counts, ends,
streams equal to whole answers, seeds, order, logprobs, stop strings cut where the text shows them, and the features
the torch engine does not implement refused with a 400 that names the llama.cpp engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from openai import OpenAI

from conftest import FleetServer
from hf_models import tiny_checkpoint  # noqa: F401  (the session fixture)

ASK = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server(launch_fleet: Callable[[list[str]], FleetServer], tiny_checkpoint: Path) -> FleetServer:  # noqa: F811
    s = launch_fleet(["--model", str(tiny_checkpoint), "--replicas", "2", "--parallel", "4", "--ctx", "512",
                      "--threads", "1"])
    s.wait_all_ready()
    return s


@pytest.fixture(scope="module")
def client(server: FleetServer) -> OpenAI:
    return server.client()


@pytest.fixture(scope="module")
def model(server: FleetServer) -> str:
    return server.model()


def test_models_and_readiness_name_the_checkpoint(client: OpenAI, model: str, server: FleetServer) -> None:
    assert [m.id for m in client.models.list().data] == [model] == ["tiny-hf"]
    status, body = server.ready()
    assert status == 200 and body["status"] == "ready"


def test_chat_and_its_stream_agree(client: OpenAI, model: str) -> None:
    whole = client.chat.completions.create(model=model, messages=ASK, max_tokens=10, temperature=0)
    (choice,) = whole.choices
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 10
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(client.chat.completions.create(model=model, messages=ASK, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_max_tokens_and_a_stop_string(client: OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage is not None and r.usage.completion_tokens == 8
    text = r.choices[0].text
    stop = text[3:5]
    cut = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=8, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == text[:text.index(stop)]


def test_a_batch_of_prompts_comes_back_in_order_as_each_alone(client: OpenAI, model: str) -> None:
    prompts = ["1, 2, 3,", "The capital of France is", "Monday, Tuesday,", "A, B, C,", "中国的首都是"]
    alone = [client.completions.create(model=model, prompt=p, max_tokens=5, temperature=0).choices[0].text
             for p in prompts]
    batch = client.completions.create(model=model, prompt=prompts, max_tokens=5, temperature=0)
    assert [c.index for c in batch.choices] == list(range(5)) and [c.text for c in batch.choices] == alone


def test_n_seeded_choices_differ_and_repeat(client: OpenAI, model: str) -> None:
    def ask() -> list[str | None]:
        r = client.chat.completions.create(model=model, messages=ASK, max_tokens=8, temperature=1.0, n=2, seed=7)
        return [c.message.content for c in r.choices]

    first = ask()
    assert first[0] != first[1] and ask() == first


def test_logprobs_and_logit_bias(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=ASK, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == 4
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in lp.content)
    assert b"".join(bytes(t.bytes or []) for t in lp.content).decode(errors="replace").startswith(
        r.choices[0].message.content or "")
    t = client.completions.create(model=model, prompt="1, 2,", max_tokens=4, temperature=0, logprobs=0,
                                  logit_bias={"1000": 100})
    tl = t.choices[0].logprobs
    assert tl is not None and tl.tokens is not None and len(set(tl.tokens)) == 1 and len(tl.tokens) == 4


def test_anthropic_messages_whole_and_streamed(server: FleetServer, model: str) -> None:
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120.0) as sdk:
        msg = sdk.messages.create(model=model, max_tokens=6, messages=[{"role": "user", "content": "Hi"}],
                                  extra_body={"temperature": 0})
        assert msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens <= 6
        with sdk.messages.stream(model=model, max_tokens=6, messages=[{"role": "user", "content": "Hi"}],
                                 extra_body={"temperature": 0}) as stream:
            assert stream.get_final_text() == "".join(b.text for b in msg.content if b.type == "text")


def test_responses_api_and_tokenize(client: OpenAI, model: str, server: FleetServer) -> None:
    r = client.responses.create(model=model, input="Hi", max_output_tokens=5, temperature=0)
    assert r.status in ("completed", "incomplete") and r.usage is not None and r.usage.output_tokens <= 5
    ids = httpx.post(f"{server.url}/tokenize", json={"content": "Hello world"}, timeout=30).json()["tokens"]
    assert ids == [15043, 3186]  # LLaMA-2's tokenizer, read from the checkpoint's tokenizer.json
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}, timeout=30).json()["content"]
    assert back.strip() == "Hello world"


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 4,
                              "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "x", "schema": {"type": "object"}}}}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "grammar": 'root ::= "a"'}),
    ("/v1/embeddings", {"input": "Hi"}),
    ("/infill", {"input_prefix": "def f(", "input_suffix": "):", "n_predict": 4}),
])
def test_what_the_torch_engine_does_not_implement_is_a_400_naming_llama_cpp(server: FleetServer, model: str,
                                                                           path: str, body: dict[str, object]) -> None:
    r = httpx.post(f"{server.url}{path}", json={"model": model, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert "llama.cpp engine" in r.json()["error"]["message"]


def test_the_sdk_sees_the_refusal_and_the_replicas_keep_serving(client: OpenAI, model: str,
                                                                  server: FleetServer) -> None:
    with pytest.raises(openai.BadRequestError, match="llama.cpp engine"):
        client.chat.completions.create(model=model, messages=ASK, max_tokens=4,
                                       response_format={"type": "json_object"})
    assert client.completions.create(model=model, prompt="Hi", max_tokens=2).usage is not None
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert "llamafleet_" in metrics and server.ready()[0] == 200
