"""llama-server's ``/tokenize``, ``/detokenize``, ``/apply-template`` and ``/props`` through a real ``llamafleet
serve`` (the demo model): the round trip text -> tokens -> text (llama.cpp's own server tests, as they are written),
pieces of multi-byte characters, the chat prompt as text giving back exactly a chat completion's prompt tokens (tools
included), ``count_tokens`` agreeing with ``/tokenize``, what ``/props`` says, refusals, and that tokenizing counts as
no generated sequence in the metrics."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest
from openai import OpenAI
from scrape import metric

from conftest import FleetServer

pytestmark = pytest.mark.each_engine

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def post(fleet: FleetServer, route: str, body: dict[str, Any]) -> httpx.Response:
    """``body`` as ASCII JSON (a lone surrogate escaped, as JSON can carry it)."""
    return httpx.post(f"{fleet.url}{route}", content=json.dumps(body), timeout=60,
                      headers={"Content-Type": "application/json"})


def ok(fleet: FleetServer, route: str, body: dict[str, Any]) -> Any:
    r = post(fleet, route, body)
    assert r.status_code == 200, r.text
    return r.json()


def test_tokenize_detokenize_round_trip(fleet: FleetServer) -> None:
    content = "What is the capital of France ?"
    tokens = ok(fleet, "/tokenize", {"content": content})["tokens"]
    assert len(tokens) > 5 and all(isinstance(t, int) for t in tokens)
    assert ok(fleet, "/detokenize", {"tokens": tokens})["content"].strip() == content
    assert ok(fleet, "/tokenize", {"content": ""})["tokens"] == [] and ok(fleet, "/detokenize", {"tokens": []}) == {
        "content": ""}


def test_pieces_cover_the_text_byte_for_byte(fleet: FleetServer) -> None:
    content = "This is a test string with unicode 媽 and emoji 🤗"
    tokens = ok(fleet, "/tokenize", {"content": content, "with_pieces": True})["tokens"]
    joined = b""
    for token in tokens:
        assert set(token) == {"id", "piece"} and token["piece"]
        piece = token["piece"]
        joined += piece.encode() if isinstance(piece, str) else bytes(piece)
    # a SentencePiece tokenizer (the torch replica's LLaMA-2 one) writes the text's first word with its leading space
    assert joined.decode() == (content if fleet.demo_model else " " + content)
    assert [t["id"] for t in tokens] == ok(fleet, "/tokenize", {"content": content})["tokens"]


def test_special_tokens_are_parsed_unless_asked_not_to(fleet: FleetServer) -> None:
    special = "<|im_start|>" if fleet.demo_model else "</s>"
    parsed = ok(fleet, "/tokenize", {"content": f"{special}user", "with_pieces": True})["tokens"]
    plain = ok(fleet, "/tokenize", {"content": f"{special}user", "parse_special": False})["tokens"]
    assert parsed[0]["piece"] == special and len(plain) > len(parsed)
    assert ok(fleet, "/detokenize", {"tokens": [parsed[0]["id"]]})["content"] == special


@pytest.mark.parametrize("tools", [False, True])
def test_apply_template_is_the_chat_prompt(fleet: FleetServer, client: OpenAI, model: str, tools: bool) -> None:
    extra: dict[str, Any] = {"tools": [WEATHER]} if tools else {}
    prompt = ok(fleet, "/apply-template", {"messages": MESSAGES, **extra})["prompt"]
    turn, ask = ("<|im_start|>user\n{}<|im_end|>", "<|im_start|>assistant\n") if fleet.demo_model else (
        "{} [/INST]", " [/INST]")  # ChatML, or LLaMA-2's template
    assert turn.format(MESSAGES[1]["content"]) in prompt
    assert prompt.endswith(ask) and ("get_weather" in prompt) == tools
    tokens = ok(fleet, "/tokenize", {"content": prompt, "add_special": True})["tokens"]
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1, **extra)  # type: ignore
    assert chat.usage is not None and len(tokens) == chat.usage.prompt_tokens
    # named, the model gives the same; the body is a chat completion's, validated as one
    assert ok(fleet, "/apply-template", {"model": model, "messages": MESSAGES, **extra})["prompt"] == prompt


def test_count_tokens_is_the_tokenize_path(fleet: FleetServer, model: str) -> None:
    question = MESSAGES[1]["content"]
    prompt = ok(fleet, "/apply-template", {"messages": [{"role": "user", "content": question}]})["prompt"]
    tokens = ok(fleet, "/tokenize", {"content": prompt, "add_special": True})["tokens"]
    with anthropic.Anthropic(base_url=fleet.url, api_key="unused", max_retries=0, timeout=60.0) as claude:
        counted = claude.messages.count_tokens(model=model, messages=[{"role": "user", "content": question}])
    assert counted.input_tokens == len(tokens)


def test_props_says_what_is_served(fleet: FleetServer, model: str) -> None:
    r = httpx.get(f"{fleet.url}/props", timeout=30)
    assert r.status_code == 200, r.text
    props = r.json()
    assert props["total_slots"] == 8 and props["default_generation_settings"]["n_ctx"] == 512  # 2 replicas x 4
    assert props["model_alias"] == model and props["model_path"].endswith(".gguf" if fleet.demo_model else model)
    special, eos = ("<|im_start|>", "<|im_end|>") if fleet.demo_model else ("[INST]", "</s>")
    assert special in props["chat_template"] and props["eos_token"] == eos
    params = props["default_generation_settings"]["params"]
    assert params["temperature"] == 1.0 and params["top_k"] == 40 and params["n_predict"] == -1
    assert httpx.get(f"{fleet.url}/props", params={"model": model}, timeout=30).json() == props


@pytest.mark.parametrize(("route", "body", "status", "param"), [
    ("/detokenize", {"tokens": [10**9]}, 400, None),
    ("/detokenize", {"tokens": [-1]}, 400, None),
    ("/detokenize", {"tokens": ["a"]}, 400, "tokens[0]"),
    ("/tokenize", {"content": 5}, 400, "content"),
    ("/tokenize", {"content": "x", "model": "nope"}, 404, "model"),
    ("/tokenize", {"content": "\ud800"}, 400, "content"),
    ("/apply-template", {"messages": []}, 400, "messages"),
    ("/apply-template", {"messages": MESSAGES, "add_generation_prompt": False}, 400, "add_generation_prompt"),
])
def test_bad_input_is_refused(fleet: FleetServer, route: str, body: dict[str, Any], status: int,
                              param: str | None) -> None:
    r = post(fleet, route, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"], error
    if route == "/detokenize" and param is None:
        assert "out of range" in error["message"]


def test_tokenizing_is_not_a_generated_sequence(fleet: FleetServer) -> None:
    def counts() -> tuple[float, float]:
        text = httpx.get(f"{fleet.url}/metrics", timeout=10).text
        return metric(text, "llamafleet_prompt_tokens_total"), metric(text, "llamafleet_sequences_total",
                                                                     outcome="length")

    before = counts()
    ok(fleet, "/tokenize", {"content": "nothing is computed " * 50})
    ok(fleet, "/apply-template", {"messages": MESSAGES})
    assert counts() == before
