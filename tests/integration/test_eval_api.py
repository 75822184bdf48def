"""What evaluation harnesses ask of ``/v1/completions`` and chat, through the OpenAI SDK against a real
``llamafleet serve``: prompt scoring (``echo`` + ``logprobs`` + ``max_tokens: 0``), top alternatives, and token-id
prompts, single and batched."""

from __future__ import annotations

import httpx
import pytest
from openai import BadRequestError, OpenAI

from conftest import FleetServer

pytestmark = pytest.mark.each_engine

STEM = "The capital of France is"


NO_SCORING = "scoring the prompt (prompt_logprobs) is not implemented by the torch engine"


@pytest.mark.llama_cpp_only(reason=NO_SCORING)
def test_echo_scores_the_prompt_without_generating(client: OpenAI, model: str) -> None:
    def score(text: str) -> float:
        r = client.completions.create(model=model, prompt=text, max_tokens=0, echo=True, logprobs=1)
        c = r.choices[0]
        assert c.text == text and c.finish_reason == "length"
        assert r.usage is not None and r.usage.completion_tokens == 0
        lp = c.logprobs
        assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
        assert "".join(lp.tokens) == text and len(lp.tokens) == r.usage.prompt_tokens
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
        assert all(len(t) == 1 for t in lp.top_logprobs[1:])  # logprobs=1: the best token at each position
        assert lp.text_offset[-1] == len(text) - len(lp.tokens[-1])
        last = lp.token_logprobs[-1]
        assert last is not None
        return last

    assert score(STEM + " Paris") > score(STEM + " London")


@pytest.mark.llama_cpp_only(reason=NO_SCORING)
def test_echo_with_generated_tokens_continues_the_lists(client: OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt=STEM, max_tokens=3, temperature=0, echo=True, logprobs=2)
    c = r.choices[0]
    assert c.text.startswith(STEM) and c.logprobs is not None and c.logprobs.tokens is not None
    assert r.usage is not None and len(c.logprobs.tokens) == r.usage.prompt_tokens + 3
    assert "".join(c.logprobs.tokens) == c.text
    tops = c.logprobs.top_logprobs
    assert tops is not None and all(len(t) == 2 for t in tops[1:])
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=model, prompt=STEM, max_tokens=3, temperature=0, echo=True, stream=True) if ch.choices)
    assert streamed == c.text


def test_chat_top_logprobs(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a colour."}],
                                       max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    assert content and len(content) == 5
    for tok in content:
        assert len(tok.top_logprobs) == 3
        values = [t.logprob for t in tok.top_logprobs]
        assert values == sorted(values, reverse=True)
        best = tok.top_logprobs[0]
        assert best.bytes == tok.bytes and best.logprob == pytest.approx(tok.logprob)  # greedy: chose the best
        assert all(t.bytes is not None and bytes(t.bytes).decode("utf-8", "replace") == t.token
                   for t in tok.top_logprobs)


def test_token_id_prompts_answer_as_their_text(fleet: FleetServer, client: OpenAI, model: str) -> None:
    texts = [STEM, "def fibonacci(n):"]
    ids = [httpx.post(f"{fleet.url}/tokenize", json={"content": t, "add_special": True}, timeout=60).json()["tokens"]
           for t in texts]  # as the replicas tokenize a text prompt
    as_text = client.completions.create(model=model, prompt=texts, max_tokens=8, temperature=0)
    single = client.completions.create(model=model, prompt=ids[0], max_tokens=8, temperature=0)
    batch = client.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0)
    assert single.choices[0].text == as_text.choices[0].text
    assert [c.text for c in batch.choices] == [c.text for c in as_text.choices]
    if fleet.engine == "llama.cpp":  # an echoed token-id prompt's text comes from scoring it (see NO_SCORING)
        echoed = client.completions.create(model=model, prompt=ids[1], max_tokens=2, temperature=0, echo=True)
        text = echoed.choices[0].text
        assert text.startswith(texts[1]) and as_text.choices[1].text.startswith(text.removeprefix(texts[1]))


def test_refusals_name_the_parameter(fleet: FleetServer, model: str) -> None:
    def post(body: dict[str, object]) -> httpx.Response:
        return httpx.post(f"{fleet.url}/v1/completions", json={"model": model, **body}, timeout=60)

    r = post({"prompt": [1, 2, 10**9], "max_tokens": 1})
    assert r.status_code == 400 and "at prompt index 2" in r.json()["error"]["message"]
    r = post({"prompt": STEM, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = post({"prompt": STEM, "max_tokens": 1, "logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    with pytest.raises(BadRequestError):
        fleet.client().completions.create(model=model, prompt=[[]], max_tokens=1)
