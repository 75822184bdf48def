"""The OpenAI-compatible API of a real ``llamafleet serve`` (2 replicas), through the official SDK: on the demo model
(llama.cpp), then on the tiny random checkpoint (torch), where what the answers say is not checked."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from conftest import FleetServer

pytestmark = pytest.mark.each_engine

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_models(client: OpenAI, model: str) -> None:
    assert [m.id for m in client.models.list().data] == [model]
    assert client.models.retrieve(model).id == model


def test_chat(fleet: FleetServer, client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=12, temperature=0)
    (choice,) = r.choices
    assert not fleet.demo_model or "Paris" in (choice.message.content or "")
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    assert r.usage is not None and 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.id.startswith("chatcmpl-") and r.model == model


def test_chat_stream_matches_the_whole_answer(client: OpenAI, model: str) -> None:
    whole = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=12, temperature=0)
    stream = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and whole.usage is not None
    # the same counts, except that the second request found its prompt in the prefix cache
    assert usage.model_dump(exclude={"prompt_tokens_details"}) == whole.usage.model_dump(
        exclude={"prompt_tokens_details"})


def test_completions_stop_and_max_tokens(fleet: FleetServer, client: OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage is not None and r.usage.completion_tokens == 12
    text = r.choices[0].text
    stop = " 8" if fleet.demo_model else text[6:8]  # the demo model counts on: " 5, 6, 7, 8, 9,"
    cut = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=40, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[:text.index(stop)] and cut.choices[0].finish_reason == "stop"
    assert not fleet.demo_model or cut.choices[0].text == " 5, 6, 7,"


def test_completions_stream(fleet: FleetServer, client: OpenAI, model: str) -> None:
    whole = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=6, temperature=0)
    chunks = list(client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=6, temperature=0,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert not fleet.demo_model or whole.choices[0].text == " 5, 6,"  # six tokens: " ", "5", ",", " ", "6", ","
    assert chunks[-1].choices[0].finish_reason == "length"


def test_batch_of_prompts_comes_back_in_input_order(client: OpenAI, model: str) -> None:
    prompts = ["1, 2, 3, 4,", "The capital of France is", "Monday, Tuesday,", "A, B, C, D,"]
    alone = [client.completions.create(model=model, prompt=p, max_tokens=6, temperature=0).choices[0].text
             for p in prompts]
    batch = client.completions.create(model=model, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert [c.text for c in batch.choices] == alone
    assert batch.usage is not None and batch.usage.completion_tokens == 4 * 6


def test_n_choices(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell me a joke."}],
                                       max_tokens=16, temperature=1.0, top_p=1.0, n=2, seed=7)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content != r.choices[1].message.content  # seeded 7 and 8: two different draws
    again = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell me a joke."}],
                                           max_tokens=16, temperature=1.0, top_p=1.0, n=2, seed=7)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    # a batch with n=2: prompt-major order, as OpenAI numbers choices
    t = client.completions.create(model=model, prompt=["1, 2,", "A, B,"], max_tokens=3, temperature=0, n=2)
    assert [c.index for c in t.choices] == [0, 1, 2, 3]
    assert t.choices[0].text == t.choices[1].text and t.choices[2].text == t.choices[3].text
    assert t.choices[0].text != t.choices[2].text


def test_streamed_n_choices_each_end_once(client: OpenAI, model: str) -> None:
    chunks = list(client.chat.completions.create(model=model, messages=QUESTION, max_tokens=5, temperature=0, n=2,
                                                 stream=True))
    texts = {0: "", 1: ""}
    ends = {0: 0, 1: 0}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            ends[ch.index] += ch.finish_reason is not None
    assert ends == {0: 1, 1: 1} and texts[0] == texts[1] and texts[0]


def test_logprobs(client: OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, temperature=0, logprobs=True)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert r.usage is not None and len(lp.content) == r.usage.completion_tokens
    assert all(t.logprob <= 0 for t in lp.content)
    assert "".join(t.token for t in lp.content).startswith(r.choices[0].message.content or "")
    t = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=0)
    tl = t.choices[0].logprobs
    assert tl is not None and tl.tokens is not None and "".join(tl.tokens) == t.choices[0].text
    assert tl.text_offset == [len("".join(tl.tokens[:i])) for i in range(4)]  # the demo model's: [0, 1, 2, 3]


def test_api_generate(fleet: FleetServer) -> None:
    r = httpx.post(f"{fleet.url}/api/generate", json={"prompt": "1, 2, 3, 4,", "max_tokens": 8, "temperature": 0},
                   timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (not fleet.demo_model or body["text"].startswith(" 5, 6")) and body["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 8
    timings = body["timings"]
    assert 0 < timings["ttft_ms"] <= timings["total_ms"]
    assert timings["tokens_per_second"] > 0


def test_logprob_bytes_are_the_tokens_own_bytes(client: OpenAI, model: str) -> None:
    """Chinese text: tokens may hold part of a UTF-8 character; their bytes must still add up to the answer."""
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "用中文介绍一下北京。"}],
                                       max_tokens=24, temperature=0, logprobs=True)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None
    joined = b"".join(bytes(t.bytes or []) for t in lp.content)
    assert joined.decode("utf-8", errors="replace").startswith(r.choices[0].message.content or "")
    assert b"\xef\xbf\xbd" not in joined  # no replacement characters standing in for real bytes


def test_streamed_text_offsets_continue_across_chunks(client: OpenAI, model: str) -> None:
    stream = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=6, temperature=0, logprobs=0,
                                       stream=True)
    text, offsets = "", []
    for chunk in stream:
        for c in chunk.choices:
            if c.logprobs is not None and c.logprobs.text_offset:
                offsets += c.logprobs.text_offset
                assert c.logprobs.text_offset[0] == len(text)  # where this chunk's text starts
            text += c.text
    assert len(offsets) == 6 and offsets == sorted(offsets) and offsets[0] == 0



def test_logit_bias_reaches_the_sampler_through_the_sdk(client: OpenAI, model: str) -> None:
    """+100 on one token id makes it every token of the answer (greedy: no chain was needed before the bias)."""
    ask = {"model": model, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0, "logprobs": 0}
    plain = client.completions.create(**ask)
    forced = client.completions.create(**ask, logit_bias={"1000": 100})
    assert plain.choices[0].logprobs is not None and forced.choices[0].logprobs is not None
    assert len(set(plain.choices[0].logprobs.tokens or [])) > 1
    tokens = forced.choices[0].logprobs.tokens or []
    assert len(tokens) == 4 and len(set(tokens)) == 1
