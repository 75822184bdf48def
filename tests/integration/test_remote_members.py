"""Remote members: a front llamafleet whose replicas are other llamafleet servers, over real HTTP on loopback.

The upstreams are real ``llamafleet serve`` processes: the shared ``fleet`` (the demo model), or a server started here
that relays it, so that it can want a key or be killed. Every answer is checked against the upstream's own greedy
answer to the same request, through the OpenAI SDK.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from conftest import FleetServer, free_port

Launch = Callable[[list[str]], FleetServer]
CHAT = [{"role": "user", "content": "Name three colours."}]


def front_args(tmp_path: Path, members: list[dict[str, Any]], **keys: Any) -> list[str]:
    """``serve`` arguments of a front whose replicas are ``members`` (plus any other config ``keys``)."""
    config = tmp_path / f"front-{time.monotonic_ns()}.yaml"
    config.write_text(yaml.safe_dump({"remote": members, **keys}), encoding="utf-8")
    return ["--config", str(config)]


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` (a server not listening yet counts as not yet) until it holds; fail saying ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{what} within {timeout:.0f}s")


def upstream_args(tmp_path: Path, fleet: FleetServer, keys: Path) -> list[str]:
    """``serve`` arguments of an upstream that wants a key of ``keys``: a server that relays the shared fleet (it
    loads no model of its own, so that it starts in a moment; the front cannot tell)."""
    return [*front_args(tmp_path, [{"url": fleet.url}], model_name="upstream"), "--api-keys-file", str(keys)]


def member_report(front: FleetServer) -> dict[str, Any]:
    status, body = front.ready()
    return {"http": status, **body["replicas"][-1]}


@pytest.fixture(scope="module")
def front(launch_fleet: Launch, fleet: FleetServer, tmp_path_factory: pytest.TempPathFactory) -> FleetServer:
    """A front whose one replica is the shared fleet (served under another name)."""
    server = launch_fleet(front_args(tmp_path_factory.mktemp("remote"), [{"url": f"{fleet.url}/v1"}],
                                     model_name="relayed"))
    server.wait_ready()
    return server


def test_remote_member_answers_chat_completions_and_streams_as_its_upstream(front: FleetServer,
                                                                             fleet: FleetServer) -> None:
    upstream, relayed = fleet.client(), front.client()
    model = fleet.model()
    want = upstream.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=24)  # type: ignore[arg-type]
    got = relayed.chat.completions.create(model="relayed", messages=CHAT, temperature=0, max_tokens=24)  # type: ignore[arg-type]
    assert got.model == "relayed"
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.choices[0].finish_reason == want.choices[0].finish_reason
    assert got.usage is not None and want.usage is not None  # the upstream's counts
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (want.usage.prompt_tokens,
                                                                      want.usage.completion_tokens)

    text = upstream.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=12)
    relayed_text = relayed.completions.create(model="relayed", prompt="The capital of France is", temperature=0,
                                              max_tokens=12)
    assert relayed_text.choices[0].text == text.choices[0].text

    stream = relayed.chat.completions.create(model="relayed", messages=CHAT, temperature=0, max_tokens=24,  # type: ignore[arg-type]
                                             stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == want.usage.completion_tokens
    # n choices are relayed as n sequences, spread over the member's slots
    two = relayed.chat.completions.create(model="relayed", messages=CHAT, temperature=0, max_tokens=8, n=2)  # type: ignore[arg-type]
    assert two.choices[0].message.content == two.choices[1].message.content


def test_remote_member_refuses_what_it_cannot_relay_and_passes_on_upstream_refusals(front: FleetServer) -> None:
    relayed = front.client()
    with pytest.raises(openai.BadRequestError, match="prompt logprobs .* are not relayed"):
        relayed.completions.create(model="relayed", prompt="Score me", max_tokens=0, echo=True, logprobs=1)
    r = httpx.post(f"{front.url}/v1/messages/count_tokens", json={"model": "relayed", "messages": CHAT}, timeout=30)
    assert r.status_code == 400 and "tokenizer" in r.text
    with pytest.raises(openai.BadRequestError, match="embeddings are not relayed"):
        relayed.embeddings.create(model="relayed", input="hello")
    # the upstream's own 400 (its context is 512 tokens) reaches the client as a 400, naming the member
    with pytest.raises(openai.BadRequestError, match="remote http://127.0.0.1.*refused the request"):
        relayed.completions.create(model="relayed", prompt="hi", max_tokens=5000)
    # a grammar is relayed to a llama.cpp upstream
    out = relayed.completions.create(model="relayed", prompt="Yes or no?", max_tokens=4, temperature=0,
                                     extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert out.choices[0].text in ("yes", "no")
    assert member_report(front)["status"] == "ready"


def test_remote_member_relays_logprobs_as_its_upstream_gives_them(front: FleetServer, fleet: FleetServer) -> None:
    upstream, relayed = fleet.client(), front.client()
    want = upstream.chat.completions.create(model=fleet.model(), messages=CHAT, temperature=0, max_tokens=8,  # type: ignore[arg-type]
                                            logprobs=True, top_logprobs=3)
    got = relayed.chat.completions.create(model="relayed", messages=CHAT, temperature=0, max_tokens=8,  # type: ignore[arg-type]
                                          logprobs=True, top_logprobs=3)
    assert want.choices[0].logprobs is not None and got.choices[0].logprobs is not None
    assert got.choices[0].logprobs.model_dump() == want.choices[0].logprobs.model_dump()
    stream = relayed.chat.completions.create(model="relayed", messages=CHAT, temperature=0, max_tokens=8,  # type: ignore[arg-type]
                                             logprobs=True, top_logprobs=3, stream=True)
    streamed = [t.model_dump() for c in stream if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content or []]
    assert streamed == want.choices[0].logprobs.model_dump()["content"]

    text_want = upstream.completions.create(model=fleet.model(), prompt="The sky is", temperature=0, max_tokens=6,
                                            logprobs=2)
    text_got = relayed.completions.create(model="relayed", prompt="The sky is", temperature=0, max_tokens=6,
                                          logprobs=2)
    assert text_got.choices[0].logprobs == text_want.choices[0].logprobs
    assert text_got.choices[0].text == text_want.choices[0].text


def test_remote_member_serves_forced_tool_calls_through_its_grammar(front: FleetServer) -> None:
    """The front renders the tools and the grammar that forces the call; the upstream samples under it."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    ask = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": tools,
           "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "temperature": 0,
           "max_tokens": 48}
    got = front.client().chat.completions.create(model="relayed", **ask)  # type: ignore[call-overload]
    calls = got.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert isinstance(json.loads(calls[0].function.arguments)["city"], str)  # the grammar held on the upstream
    assert got.choices[0].finish_reason == "tool_calls"


def test_a_client_that_leaves_mid_stream_frees_the_members_slot_and_the_upstreams(front: FleetServer,
                                                                                  fleet: FleetServer) -> None:
    with httpx.stream("POST", f"{front.url}/v1/completions", timeout=60, json={
            "model": "relayed", "prompt": "Once upon a time", "max_tokens": 500, "ignore_eos": True,
            "stream": True}) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
    # the front aborts the relay, the relay closes its upstream stream, and the upstream aborts the sequence

    def idle(server: FleetServer) -> bool:
        return all(rep["outstanding"] == 0 and rep["slots_busy"] == 0 for rep in server.ready()[1]["replicas"])

    wait_for(lambda: idle(front) and idle(fleet), 4, "slots stayed busy after the client left")  # 500 tokens: ~8 s


def test_remote_member_with_a_wrong_key_is_down_and_says_why(launch_fleet: Launch, fleet: FleetServer,
                                                             tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("right-key\n", encoding="utf-8")
    wrong = tmp_path / "wrong"
    wrong.write_text("wrong-key\n", encoding="utf-8")
    upstream = launch_fleet(upstream_args(tmp_path, fleet, keys))
    upstream.wait_ready()
    front = launch_fleet(front_args(tmp_path, [{"url": upstream.url, "api_key_file": str(wrong)}],
                                    model_name="relayed"))
    wait_for(lambda: "401" in (member_report(front)["last_error"] or ""), 60, "the member did not report the 401")
    report = member_report(front)
    assert report["http"] == 503 and report["status"] in ("down", "loading")
    assert "refused this server's credentials" in report["last_error"] and "wrong-key" not in front.log()
    # the failed probes are load failures, retried with backoff, never taken for crashes of a loaded replica
    assert "stopped:" not in front.log()


def test_remote_upstream_that_dies_mid_stream_fails_cleanly_and_comes_back(launch_fleet: Launch, fleet: FleetServer,
                                                                          tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("member-key\n", encoding="utf-8")
    args = [*upstream_args(tmp_path, fleet, keys), "--port", str(free_port())]
    upstream = launch_fleet(args)
    upstream.wait_ready()
    os.environ["TEST_REMOTE_MEMBER_KEY"] = "member-key"  # the front reads the member's key from its environment
    try:
        front = launch_fleet(front_args(tmp_path, [{"url": upstream.url, "api_key_env": "TEST_REMOTE_MEMBER_KEY",
                                                    "max_concurrency": 2}], model_name="relayed"))
    finally:
        del os.environ["TEST_REMOTE_MEMBER_KEY"]
    front.wait_ready()
    assert "member-key" not in front.log()
    stream = front.client().completions.create(model="relayed", prompt="Once upon a time", temperature=0,
                                               max_tokens=400, extra_body={"ignore_eos": True}, stream=True)
    first = next(iter(stream))
    assert first.choices[0].text
    os.killpg(upstream.proc.pid, signal.SIGKILL)  # the upstream and its workers, mid-answer
    with pytest.raises(openai.APIError, match="remote http://127.0.0.1"):
        for _ in stream:
            pass
    assert httpx.get(f"{front.url}/health", timeout=10).status_code == 200
    wait_for(lambda: member_report(front)["status"] in ("down", "loading"), 30, "the member was not reported down")
    with pytest.raises(openai.APIStatusError) as refused:
        front.client().completions.create(model="relayed", prompt="hi", max_tokens=2)
    assert refused.value.status_code == 503

    upstream.stop()
    again = launch_fleet(args)
    again.wait_ready()
    front.wait_ready(timeout=90)  # re-probed with backoff: at most 30 s apart
    out = front.client().completions.create(model="relayed", prompt="Once upon a time", temperature=0, max_tokens=6)
    assert out.choices[0].text and member_report(front)["restarts"] >= 1


def test_remote_members_of_one_model_in_a_models_list_share_its_load_and_load_and_unload_with_it(
        launch_fleet: Launch, fleet: FleetServer, model_path: Path, tmp_path: Path) -> None:
    admin = tmp_path / "admin"
    admin.write_text("admin-key\n", encoding="utf-8")
    config = tmp_path / "models.yaml"
    config.write_text(yaml.safe_dump({"parallel": 2, "context_length": 256, "threads": 1,
                                      "routing": "least_outstanding", "admin_api_keys_file": str(admin), "models": [
        {"name": "near", "path": str(model_path), "pinned": True},
        {"name": "spread", "path": str(model_path), "remote": [{"url": fleet.url, "max_concurrency": 2}]},
        {"name": "far", "aliases": ["elsewhere"], "remote": [{"url": fleet.url}]},
    ]}), encoding="utf-8")
    front = launch_fleet(["--config", str(config)])
    front.wait_ready()
    out = front.client().completions.create(model="spread", prompt="Count to 3:", max_tokens=8, temperature=0)
    want = fleet.client().completions.create(model=fleet.model(), prompt="Count to 3:", max_tokens=8, temperature=0)
    assert out.choices[0].text == want.choices[0].text
    body = front.wait_all_ready(60)
    spread = {r["index"]: r["where"] for r in body["replicas"] if str(r["index"]).startswith("spread/")}
    assert spread == {"spread/0": "spread on CPU", "spread/1": f"spread on remote {fleet.url}"}

    # the local and the remote replica of one model share its load, and give the same greedy answers
    def ask(i: int) -> tuple[str, str]:
        r = httpx.post(f"{front.url}/v1/completions", timeout=120, json={
            "model": "spread", "prompt": f"Count to {i}:", "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.headers["x-llamafleet-replicas"], r.json()["choices"][0]["text"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert {where for where, _ in answers} == {"0", "1"}  # the model's replicas: spread/0 and spread/1
    assert answers[3][1] == want.choices[0].text
    # a request a member cannot relay (scoring the prompt) goes to the local replica, every time
    for _ in range(3):
        r = httpx.post(f"{front.url}/v1/completions", timeout=60, json={
            "model": "spread", "prompt": "Count to 3:", "max_tokens": 0, "echo": True, "logprobs": 1})
        assert r.status_code == 200 and r.headers["x-llamafleet-replicas"] == "0", r.text
    card = httpx.get(f"{front.url}/v1/models/spread", timeout=10).json()
    assert card["where"] == ["CPU", f"remote {fleet.url}"]
    r = httpx.post(f"{front.url}/admin/models/spread/unload", headers={"Authorization": "Bearer admin-key"},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert not [r for r in front.ready()[1]["replicas"] if str(r["index"]).startswith("spread/")]
    # a model of remote members only: nothing to load here, always there, never unloaded
    far = front.client().completions.create(model="elsewhere", prompt="Count to 3:", max_tokens=8, temperature=0)
    assert far.choices[0].text == want.choices[0].text
    card = httpx.get(f"{front.url}/v1/models/far", timeout=10).json()
    assert (card["state"], card["pinned"], card["where"]) == ("loaded", True, [f"far on remote {fleet.url}"])
    r = httpx.post(f"{front.url}/admin/models/far/unload", headers={"Authorization": "Bearer admin-key"}, timeout=60)
    assert r.status_code == 409
