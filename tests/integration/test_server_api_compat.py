"""The other clients of a real ``llamafleet serve`` (demo model, 2 replicas, 512 tokens of context per sequence): the
OpenAI SDK sending explicit nulls and hitting the context's end, the Anthropic SDK on ``/v1/messages``, and the
OpenAI SDK's Responses API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai import OpenAI

from conftest import FleetServer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
LONG = "The quick brown fox jumps over the lazy dog. " * 60  # about 600 tokens: more than the context alone


@pytest.fixture(scope="module")
def served(fleet: FleetServer) -> tuple[OpenAI, str]:
    """The OpenAI SDK's client of the shared server, and the served model's name."""
    return fleet.client(), fleet.model()


@pytest.fixture(scope="module")
def claude(fleet: FleetServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=fleet.url, api_key="unused", max_retries=0, timeout=120.0) as sdk:
        yield sdk


def _message(err: openai.APIStatusError) -> str:
    """The error body's message (the exception's own message starts with the status)."""
    body: Any = err.body
    return str(body["message"])


def test_explicit_nulls_are_served(fleet: FleetServer, served: tuple[OpenAI, str]) -> None:
    client, model = served
    nulls = {k: None for k in ("temperature", "top_p", "n", "stop", "seed", "stream", "stream_options", "tools",
                               "tool_choice", "parallel_tool_calls", "response_format", "logprobs", "top_logprobs",
                               "user", "metadata", "store", "presence_penalty", "frequency_penalty",
                               "max_completion_tokens")}
    body = {"model": model, "messages": QUESTION, "max_tokens": 6, **nulls, "logit_bias": {}}
    r = httpx.post(f"{fleet.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 6
    sdk = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=6, temperature=0,
                                         extra_body={"tools": None, "logit_bias": {}, "top_logprobs": None})
    assert sdk.choices[0].message.content
    text = httpx.post(f"{fleet.url}/v1/completions", timeout=60,
                      json={"model": model, "prompt": "1, 2, 3,", "max_tokens": None, "echo": None, "suffix": None,
                            "logprobs": None, "best_of": None, "temperature": 0})
    assert text.status_code == 200 and text.json()["usage"]["completion_tokens"] == 16  # null: the default 16


def test_llama_server_fields_on_the_openai_routes(served: tuple[OpenAI, str]) -> None:
    """What a client written for llama-server sends beside OpenAI's fields (docs/API.md, llama-server's fields)."""
    client, model = served
    extra = {"cache_prompt": True, "id_slot": -1, "samplers": ["top_k", "top_p", "temperature"], "n_predict": 5,
             "n_probs": 2, "repeat_last_n": 32, "t_max_predict_ms": 1000, "mirostat": 0, "lora": []}
    chat = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, extra_body=extra)
    assert chat.usage is not None and chat.usage.completion_tokens == 5  # n_predict cut the answer
    assert chat.choices[0].logprobs is not None
    assert all(len(t.top_logprobs) == 2 for t in chat.choices[0].logprobs.content or [])
    text = client.completions.create(model=model, prompt="1, 2, 3,", temperature=0,
                                     extra_body={"n_predict": 20, "cache_prompt": False, "ignore_eos": True})
    assert text.usage is not None and text.usage.completion_tokens == 20  # not completions' default of 16
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=QUESTION, extra_body={"mirostat": 2})
    assert caught.value.param == "mirostat"
    several = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=3, extra_body={"n_cmpl": 2})
    assert [c.index for c in several.choices] == [0, 1]  # llama-server's n
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
    for kind in ("chat", "text"):
        body = {"max_tokens": 40, "temperature": 0, "extra_body": {"json_schema": schema}}
        out = (client.chat.completions.create(model=model, messages=QUESTION, **body).choices[0].message.content
               if kind == "chat" else client.completions.create(model=model, prompt="Q: Is it? A:", **body)
               .choices[0].text)
        assert json.loads(out or "")["answer"] in ("yes", "no"), out


def test_context_overflow_in_openai_words(served: tuple[OpenAI, str]) -> None:
    client, model = served
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": LONG[:1500]}],
                                       max_tokens=300)
    err = caught.value
    message = _message(err)
    assert err.code == "context_length_exceeded" and err.param == "messages"
    assert message.startswith("This model's maximum context length is 512 tokens. However, you requested ")
    assert message.endswith("in the messages, 300 in the completion). Please reduce the length of the messages or "
                            "completion.")
    with pytest.raises(openai.BadRequestError) as caught:  # no max_tokens: the prompt alone leaves no room
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": LONG}])
    assert caught.value.code == "context_length_exceeded" and "your messages resulted in" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt=LONG, max_tokens=8)
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "prompt"
    assert _message(caught.value).startswith("This model's maximum context length is 512 tokens, however you "
                                             "requested ")


def test_messages(claude: anthropic.Anthropic, served: tuple[OpenAI, str]) -> None:
    model = served[1]
    msg = claude.messages.create(model=model, max_tokens=12, system="Answer in one word.", messages=QUESTION,
                                 extra_body={"temperature": 0})
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant" and msg.model == model
    (block,) = msg.content
    assert block.type == "text" and "Paris" in block.text
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None
    assert msg.usage.input_tokens > 0 and 0 < msg.usage.output_tokens <= 12
    cut = claude.messages.create(model=model, max_tokens=2, messages=QUESTION)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2


def test_messages_stream_matches_the_whole_answer(claude: anthropic.Anthropic, served: tuple[OpenAI, str]) -> None:
    model = served[1]
    whole = claude.messages.create(model=model, max_tokens=12, messages=QUESTION, extra_body={"temperature": 0})
    with claude.messages.stream(model=model, max_tokens=12, messages=QUESTION,
                                extra_body={"temperature": 0}) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-1] == "message_stop"
    assert final.content[0].type == "text" and whole.content[0].type == "text"
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    # the same prompt in all: what one request read from the prefix cache, the other may have computed
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens


def test_stop_sequence_is_reported(claude: anthropic.Anthropic, served: tuple[OpenAI, str]) -> None:
    model = served[1]
    msg = claude.messages.create(model=model, max_tokens=40, stop_sequences=["zzz", " 8"],
                                 messages=[{"role": "user", "content": "Count: 1, 2, 3, 4, 5, 6,"}],
                                 extra_body={"temperature": 0})
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", " 8"), msg  # the demo model counts on
    assert " 8" not in msg.content[0].text  # type: ignore[union-attr]
    with claude.messages.stream(model=model, max_tokens=40, stop_sequences=["zzz", " 8"],
                                messages=[{"role": "user", "content": "Count: 1, 2, 3, 4, 5, 6,"}],
                                extra_body={"temperature": 0}) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == (msg.stop_reason, msg.stop_sequence)


def test_count_tokens_matches_the_prompt_of_a_real_request(claude: anthropic.Anthropic,
                                                           served: tuple[OpenAI, str]) -> None:
    model = served[1]
    system = "You are terse."
    counted = claude.messages.count_tokens(model=model, system=system, messages=QUESTION)
    msg = claude.messages.create(model=model, max_tokens=1, system=system, messages=QUESTION)
    assert counted.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens > 0
    long = claude.messages.count_tokens(model=model, messages=[{"role": "user", "content": LONG * 2}])
    assert long.input_tokens > 512  # counted whole, though it could never run here


def test_messages_refusals(claude: anthropic.Anthropic, served: tuple[OpenAI, str]) -> None:
    model = served[1]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=model, max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}])
    assert "image content is not supported" in caught.value.message
    body: Any = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=model, max_tokens=300, messages=[{"role": "user", "content": LONG[:1500]}])
    assert "exceed context limit" in caught.value.message
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude-not-served-here", max_tokens=8, messages=QUESTION)


def test_responses(served: tuple[OpenAI, str]) -> None:
    client, model = served
    r = client.responses.create(model=model, input="What is the capital of France?", max_output_tokens=12,
                                temperature=0, instructions="Answer in one word.")
    assert r.id.startswith("resp_") and r.object == "response" and r.status in ("completed", "incomplete")
    assert "Paris" in r.output_text and r.instructions == "Answer in one word."
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant"
    assert r.usage is not None and 0 < r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    cut = client.responses.create(model=model, input=[{"role": "user", "content": "Tell me a story."}],
                                  max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"


def test_responses_stream(served: tuple[OpenAI, str]) -> None:
    client, model = served
    whole = client.responses.create(model=model, input="What is the capital of France?", max_output_tokens=12,
                                    temperature=0)
    events = list(client.responses.create(model=model, input="What is the capital of France?",
                                          max_output_tokens=12, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    last: Any = events[-1]
    assert last.response.output_text == text and last.response.usage.output_tokens == whole.usage.output_tokens  # type: ignore[union-attr]


def test_an_unknown_previous_response_is_not_found(served: tuple[OpenAI, str]) -> None:
    client, model = served
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=model, input="And Germany?", previous_response_id="resp_123")
    assert caught.value.param == "previous_response_id" and caught.value.code == "previous_response_not_found"


def test_prefix_cache_reads_show_in_each_dialects_usage(claude: anthropic.Anthropic,
                                                         served: tuple[OpenAI, str]) -> None:
    """The same long system prompt twice: the second request's cached prompt tokens are reported as each API does
    (Anthropic apart from input_tokens, the Responses API inside them). Prefix routing sends both to one replica."""
    client, model = served
    system = "You answer questions about geography in one short sentence. " * 12  # about 130 tokens
    first, second = (claude.messages.create(model=model, max_tokens=4, system=system, messages=QUESTION)
                     for _ in range(2))
    assert first.usage.input_tokens + first.usage.cache_read_input_tokens == \
        second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens >= 0.9 * (second.usage.input_tokens
                                                          + second.usage.cache_read_input_tokens)
    answers = [client.responses.create(model=model, instructions=system, input="What is the capital of Spain?",
                                       max_output_tokens=4) for _ in range(2)]
    usage = answers[1].usage
    assert usage is not None and usage.input_tokens_details.cached_tokens >= 0.9 * usage.input_tokens
