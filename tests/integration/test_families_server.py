"""The conformance matrix (docs/MODELS.md), on a real server: one synthetic model per family, carrying the family's
real chat template and tokenizer from llama.cpp's source (``llamafleet synth --vocab --chat-template``), all behind
one ``llamafleet serve`` that loads each on demand. The cases of tests/family_cases.py are forced with the request's
``grammar`` (the model's weights are random: the grammar makes it write exactly the family's raw output), and what
the OpenAI SDK (chat, whole and streamed; Responses) and the Anthropic SDK (Messages) receive is checked: reasoning
apart, calls with their indices and ids, no markup in the content. Then what the server itself constrains: forced
calls in the family's own format, the reasoning budget closing the think block, a JSON schema after reasoning. Which
case runs for which family: ``CHECKS``. The families' other cases (text before calls, calls in reasoning, ...) are
read by the unit tests alone (tests/unit/api/test_families.py: whole and streamed in every split), as the server
adds nothing to them.

Every family is served with LLaMA-2's tokenizer, cut to its first 8,000 tokens (its markers spelled out as text,
which the reading must handle anyway): sampling under a grammar masks the whole vocabulary at each forced token,
which over the 128k-262k tokens of the families' own tokenizers made this module minutes long.
tests/integration/test_family_vocabs.py reads those families' outputs through their own tokenizers instead (Gemma
4's markers tokens of their own, streamed token by token as the engine shows them), and Gemma 4 goes through the
server on its own tokenizer as well (``test_a_real_tokenizer_over_the_server``).

Tests run family by family (one model loaded at a time, once, the last one unloaded when idle)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from gguf import GGUFWriter
from openai import OpenAI

from conftest import FleetServer
from family_cases import FAMILIES
from family_types import HELLO, TOOLS, Case, Family, supported
from llamafleet.api import call_stream
from llamafleet.engine import families
from llamafleet.model.synth import SHAPES, find_template, find_vocab, vocab_fields, write_model

MESSAGES = [{"role": "user", "content": "Hi"}]
GEMMA4 = next(f for f in FAMILIES if f.name == "gemma4")
PIECES = 8000  # of LLaMA-2's tokenizer: a grammar's mask over them costs a quarter of one over all 32,000
OWN = "gemma4-own-tokenizer"  # Gemma 4's template on its own tokenizer (262k tokens; its markers are tokens)
LIMIT = 800  # tokens: the longest raw output (Kimi K3's two calls, its tags spelled out by LLaMA-2's tokenizer) fits
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
          "additionalProperties": False}


def first_pieces(vocab: Path, n: int, out: Path) -> Path:
    """A tokenizer GGUF of ``vocab``'s first ``n`` tokens (LLaMA-2's: its control tokens, its 256 bytes, then its
    pieces by rank), for a grammar mask over fewer tokens; what it lacks is written in bytes."""
    writer = GGUFWriter(out, "llama")
    for key, field in vocab_fields(vocab).items():
        if not key.startswith("tokenizer.chat_template"):
            value = field.value[:n] if isinstance(field.value, list) else field.value
            writer.add_key_value(key, value, field.vtype, sub_type=field.sub_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return out


@pytest.fixture(scope="module")
def server(launch_fleet: Callable[[list[str]], FleetServer], tmp_path_factory: pytest.TempPathFactory) -> FleetServer:
    folder = tmp_path_factory.mktemp("families")
    entries = []
    small = first_pieces(find_vocab(), PIECES, folder / "llama-spm-8k.gguf")
    for name, f, vocab in [(f.name, f, small) for f in FAMILIES] + [(OWN, GEMMA4, find_vocab(GEMMA4.vocab))]:
        path = write_model(folder / f"{name}.gguf", SHAPES["micro"], "q8_0", vocab, progress=False,
                           chat_template=find_template(f.template))
        entries.append(f"  - {{name: {name}, path: {path}, idle_ttl_s: 2}}\n")
    config = folder / "fleet.yaml"
    config.write_text("parallel: 1\ncontext_length: 3072\nthreads: 1\nmodels:\n" + "".join(entries), encoding="utf-8")
    fleet = launch_fleet(["--config", str(config)])
    fleet.wait_ready()
    return fleet


@pytest.fixture(scope="module")
def client(server: FleetServer) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120.0)


@pytest.fixture(scope="module")
def claude(server: FleetServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120.0) as sdk:
        yield sdk


def forced(text: str) -> dict[str, Any]:
    return {"grammar": "root ::= " + json.dumps(text, ensure_ascii=False)}


def markers(family: Family) -> tuple[str, ...]:
    return families.markers(families.FAMILIES[family.name])


def _calls(calls: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


def check_chat(client: OpenAI, family: Family, case: Case, model: str = "") -> None:
    """One raw output through chat, streamed (in the tokenizer's pieces), and whole for the families of
    ``EVERY_WAY`` where it holds calls or reasoning (the whole text is the raw output the unit tests read): the same
    message, the stream's calls in order. ``model``: the family's model unless given."""
    args: dict[str, Any] = {"model": model or family.name, "messages": MESSAGES, "tools": TOOLS, "max_tokens": LIMIT,
                            "temperature": 0, "extra_body": forced(case.output)}
    if family.name in EVERY_WAY and (case.calls or case.reasoning) and not model:
        msg = client.chat.completions.create(**args).choices[0].message
        assert (msg.content or "") == case.content
        assert ((msg.model_extra or {}).get("reasoning_content") or "") == case.reasoning
        assert (msg.model_extra or {}).get("reasoning") == ((msg.model_extra or {}).get("reasoning_content"))
        assert _calls(msg.tool_calls or []) == list(case.calls)
        if case.ids:
            assert tuple(c.id for c in msg.tool_calls or []) == case.ids
    content, reasoning, deltas, finish = "", "", [], None
    for chunk in client.chat.completions.create(stream=True, **args):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        deltas += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
        for marker in markers(family) if case.calls else ():
            assert marker not in (delta.content or ""), delta
    streamed = assembled(deltas)
    if case.streamed is not None:  # the call went out before its arguments broke: it stays a call
        assert [(name, args) for name, args, _ in streamed] == list(case.streamed) and not content
        return
    assert reasoning == case.reasoning and content.strip() == case.content.strip()
    assert [(name, json.loads(args)) for name, args, _ in streamed] == list(case.calls)
    fmt = families.FAMILIES[family.name].calls
    if case.calls and fmt in call_stream.SHAPES and fmt != "gemma":  # the arguments came as written, not whole
        assert len(deltas) > len(case.calls), deltas
    if case.ids:
        assert tuple(i for _, _, i in streamed) == case.ids
    assert finish == ("tool_calls" if case.calls else "stop")


def assembled(deltas: list[Any]) -> list[tuple[str, str, str]]:
    """The calls an OpenAI client puts together from streamed deltas, by index: (name, arguments, id); a new call's
    first delta takes the next index and names it, the others carry the index and arguments only."""
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if d.index not in calls:
            assert d.index == len(calls) and d.id and d.function.name, d
            calls[d.index] = [d.function.name, "", d.id]
        else:
            assert d.id is None and d.function.name is None, d
        calls[d.index][1] += d.function.arguments or ""
    return [(name, args, i) for name, args, i in calls.values()]


def check_responses(client: OpenAI, family: Family, case: Case) -> None:
    """The same output through the Responses API, streamed: a reasoning item first, then the message and calls."""
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    with client.responses.stream(model=family.name, input="Hi", tools=tools, max_output_tokens=LIMIT,  # type: ignore
                                 extra_body=forced(case.output)) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_response()
    kinds = [item.type for item in final.output]
    assert kinds == (["reasoning"] if case.reasoning else []) + (["message"] if case.content or not case.calls
                                                                    else []) + ["function_call"] * len(case.calls)
    if case.reasoning:
        assert final.output[0].content[0].text == case.reasoning  # type: ignore[union-attr,index]
        assert "response.reasoning_text.delta" in events
    calls = [(i.name, json.loads(i.arguments)) for i in final.output if i.type == "function_call"]
    assert calls == list(case.calls)
    assert final.output_text == case.content


def check_messages(claude: anthropic.Anthropic, family: Family, case: Case) -> None:
    """The same output through Anthropic's Messages, streamed (as the SDK assembles it): a thinking block, text,
    tool_use blocks (the whole answer is built by the same code, tested with chat)."""
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    args: dict[str, Any] = {"model": family.name, "max_tokens": LIMIT, "messages": MESSAGES, "tools": tools,
                            "extra_body": forced(case.output)}
    with claude.messages.stream(**args) as stream:
        msg = stream.get_final_message()
    kinds = [b.type for b in msg.content]
    assert kinds == (["thinking"] if case.reasoning else []) + (["text"] if case.content or not case.calls
                                                                   else []) + ["tool_use"] * len(case.calls)
    assert [b.thinking for b in msg.content if b.type == "thinking"] == ([case.reasoning] if case.reasoning else [])
    assert [(b.name, b.input) for b in msg.content if b.type == "tool_use"] == list(case.calls)
    assert msg.stop_reason == ("tool_use" if case.calls else "end_turn")


def check_forced(client: OpenAI, family: Family) -> None:
    """``tool_choice: "required"``: the model writes one call in its own format (the grammar), after at most a short
    think block (a budget of 3), and stops there (under 300 tokens: Hunyuan 3's tags spelled out by LLaMA-2's
    tokenizer take 200); streamed, and whole as well for the families of ``EVERY_WAY``."""
    known = families.FAMILIES[family.name]
    extra = {"reasoning_budget": 3} if known.think else {}
    for stream in (False, True) if family.name in EVERY_WAY else (True,):
        args: dict[str, Any] = {"model": family.name, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 300,
                                "tool_choice": "required", "parallel_tool_calls": False, "extra_body": extra,
                                "temperature": 0}
        if stream:
            chunks = [c for c in client.chat.completions.create(stream=True, **args) if c.choices]
            content = "".join(c.choices[0].delta.content or "" for c in chunks)
            calls = [openai.types.chat.ChatCompletionMessageToolCall.model_validate(
                {"id": i, "type": "function", "function": {"name": name, "arguments": arguments}})
                for name, arguments, i in assembled([d for c in chunks for d in c.choices[0].delta.tool_calls or []])]
            finish = chunks[-1].choices[0].finish_reason
        else:
            choice = client.chat.completions.create(**args).choices[0]
            content, calls, finish = choice.message.content or "", choice.message.tool_calls or [], choice.finish_reason
        assert finish == "tool_calls" and len(calls) == 1, (content, calls)
        assert calls[0].function.name in ("special_function", "special_function_with_opt")
        assert isinstance(json.loads(calls[0].function.arguments)["arg1"], int)
        assert content.strip() == ""


def check_budget(client: OpenAI, family: Family, control: dict[str, Any] | None = None, limit: int = 200) -> None:
    """A think block that would run on (the grammar allows 300 characters in it) is closed by a budget of 4 (or the
    request's other ``control`` of it, under a token ``limit``) with the family's own marker: the answer is as long
    as one whose block holds a single letter, plus the budget and a few."""
    known = families.FAMILIES[family.name]
    assert known.think is not None
    opened = "" if family.opens_think else json.dumps(known.think[0])

    def answer(body: str, extra: dict[str, Any]) -> tuple[str, str, int]:
        grammar = f'root ::= {opened} {body} {json.dumps(known.think[1])} "ok"'
        r = client.chat.completions.create(model=family.name, messages=MESSAGES, max_tokens=limit,  # type: ignore
                                           temperature=0, extra_body={"grammar": grammar, **extra})
        msg = r.choices[0].message
        assert r.usage is not None
        return msg.content or "", (msg.model_extra or {}).get("reasoning_content") or "", r.usage.completion_tokens

    content, thought, used = answer("[a-z ]{1,300}", control or {"reasoning_budget": 4})
    _, _, least = answer('"a"', {})
    assert content == "ok" and thought and used <= least - 1 + 4 + 2


def check_schema(client: OpenAI, family: Family) -> None:
    """A JSON schema after the think block: the answer is the JSON (a budget of 3 keeps the random model's thinking
    short; greedy, so the answer is the same on every run: the schema's spaces and digits let a sampled one run
    long); a template that opens the block makes the model close it first."""
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    r = client.chat.completions.create(model=family.name, messages=MESSAGES, max_tokens=300,  # type: ignore
                                       temperature=0, response_format=fmt, extra_body={"reasoning_budget": 3})
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    assert set(json.loads(msg.content or "")) == {"answer"}
    if family.opens_think:
        assert (msg.model_extra or {}).get("reasoning_content")


def _case(family: Family, what: str) -> Case:
    return next(c for c in family.cases if c.what == what)


def check_history(client: OpenAI, family: Family) -> None:
    """A second turn after a call: the conversation (the call, its result, the reasoning of the turn) renders
    through the family's template and is answered."""
    history = [*MESSAGES,
               {"role": "assistant", "content": None, "reasoning_content": "I should call it.",
                "tool_calls": [{"id": "call_1", "type": "function",
                                "function": {"name": "special_function", "arguments": '{"arg1": 1}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    think = families.FAMILIES[family.name].think
    answer = (think[1] if family.opens_think and think else "") + HELLO  # (a think block the prompt opened: closed)
    r = client.chat.completions.create(model=family.name, messages=history, tools=TOOLS,  # type: ignore
                                       max_tokens=40, extra_body=forced(answer))
    assert r.choices[0].message.content == HELLO


def check(feature: str, family: Family, client: OpenAI, claude: anthropic.Anthropic) -> None:
    if feature == "forced":
        check_forced(client, family)
    elif feature == "budget":
        check_budget(client, family)
    elif feature == "schema":
        check_schema(client, family)
    elif feature == "history":
        check_history(client, family)
    else:
        case = _case(family, feature)
        check_chat(client, family, case)
        if family.name in EVERY_WAY and (feature == "tools" or feature == "reasoning" and not _case(family,
                                                                                               "tools").reasoning):
            check_responses(client, family, case)
            check_messages(claude, family, case)


def _shown(family: Family, feature: str) -> bool:
    """Whether ``feature`` has a check of its own here: a family outside ``EVERY_WAY`` whose tools case thinks
    before its call shows its reasoning split there (its reasoning case is read whole and streamed by the unit
    tests)."""
    if family.name in EVERY_WAY:
        return True
    return feature not in ("chat", "parallel") and not (feature == "reasoning" and _case(family, "tools").reasoning)


HISTORY = ("qwen3", "glm", "kimi-thinking", "gemma4", "kimi-k3", "deepseek-v3.2", "minimax-m3")  # replay reasoning
# What runs over the server. tests/unit/api/test_families.py reads every raw output of tests/family_cases.py, whole
# and streamed in any split; here each family's own outputs go through the server: its call and its think block
# through chat, streamed (one request where its call follows its thinking), its malformed calls (a stream must not
# break on them), and what the server itself constrains (a forced call, the reasoning budget, a schema after
# reasoning, a second turn through its template). What builds on that reading the same way for every family (answers
# whole, the Responses and Messages streams of its call, and of its reasoning case where the call does not follow
# thinking, several calls with their indices, plain text) runs on EVERY_WAY: one family per kind of call stream (JSON
# with a think block, XML parameters, Mistral's calls sent whole at the end, Harmony's channels, Gemma's arguments
# sent whole).
EVERY_WAY = ("qwen3", "qwen3.5", "mistral", "gpt-oss", "gemma4")
# each family's checks one after the other, so its model is loaded once
CHECKS = [(f, x) for f in FAMILIES for x in (
    *(x for x in ("chat", "tools", "parallel", "reasoning", "forced", "budget", "schema")
      if supported(f, x) and _shown(f, x)),
    *(c.what for c in f.cases if c.what == "malformed call"),
    *(("history",) if f.name in HISTORY else ()))]


@pytest.mark.parametrize(("family", "feature"), CHECKS, ids=[f"{f.name}-{x}" for f, x in CHECKS])
def test_each_family(family: Family, feature: str, client: OpenAI, claude: anthropic.Anthropic) -> None:
    check(feature, family, client, claude)


def test_a_reasoning_effort_is_a_budget(client: OpenAI) -> None:
    """``reasoning_effort: "minimal"`` under a limit of 40 tokens: a budget of 10% of them, 4."""
    check_budget(client, next(f for f in FAMILIES if f.name == "qwen3"), {"reasoning_effort": "minimal"}, 40)


def test_bad_reasoning_controls_are_400s_naming_the_parameter(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="qwen3", messages=MESSAGES, max_tokens=4,  # type: ignore
                                       extra_body={"chat_template_kwargs": {"messages": []}})
    assert "chat_template_kwargs" in str(e.value) and "messages" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="qwen3", messages=MESSAGES, max_tokens=4,  # type: ignore
                                       extra_body={"reasoning_budget": 10})
    assert "reasoning_budget" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="qwen3", messages=MESSAGES, max_tokens=4,  # type: ignore
                                       extra_body={"reasoning_effort": "extreme"})
    assert "reasoning_effort" in str(e.value)


def test_a_real_tokenizer_over_the_server(client: OpenAI) -> None:
    """Gemma 4's template on its own tokenizer, where its markers are tokens of their own: a think block and a call,
    streamed token by token, read as with LLaMA-2's tokenizer."""
    check_chat(client, GEMMA4, _case(GEMMA4, "call after reasoning"), OWN)
