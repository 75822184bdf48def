"""Remote members without a server: their configuration, what they refuse to relay, and the translation of a
request into the upstream's body and of its stream back (the servers themselves: tests/integration/
test_remote_members.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_dispatch import Replicas, run

from llamafleet.cli import main
from llamafleet.config import ConfigError, load_config
from llamafleet.engine.types import SamplingParams
from llamafleet.fleet.dispatch import Dispatcher, Unservable
from llamafleet.fleet.messages import Submit
from llamafleet.fleet.relay import RemoteMember, StreamReader, UpstreamError, upstream_failure, upstream_request
from llamafleet.fleet.remote import NO_CONTEXT_LIMIT, MemberLauncher, member_specs, members, unrelayable


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("member", "words"), [
    ("{url: 10.0.0.2:8080}", "'remote.0': url must start with http:// or https://"),
    ("{url: 'http://user:pw@host:8080'}", "must not hold credentials"),
    ("{url: 'http://h', api_key_env: K, api_key_file: /k}", "api_key_env or api_key_file, not both"),
    ("{url: 'http://h', max_concurency: 4}", "did you mean 'remote.0.max_concurrency'"),
    ("{url: 'http://h', max_concurrency: 0}", "'remote.0.max_concurrency'"),
])
def test_remote_member_config_errors_name_the_field_and_the_fix(tmp_path: Path, member: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        load_config(config(tmp_path, f"remote: [{member}]\n"))


def test_remote_members_of_several_models_go_in_each_models_entry(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="give each model entry its own remote: list"):
        load_config(config(tmp_path, "remote: [{url: 'http://h'}]\nmodels: [{name: a, path: a.gguf}]\n"))
    cfg = load_config(config(tmp_path, "models: [{name: a, path: a.gguf, remote: [{url: 'http://h'}]}]\n"))
    assert cfg.models is not None and cfg.models[0].remote[0].url == "http://h"
    with pytest.raises(ConfigError, match="url must start with http"):
        load_config(config(tmp_path, "models: [{name: a, path: a.gguf, remote: [{url: h}]}]\n"))
    with pytest.raises(ConfigError, match="did you mean 'models.0.remote.0.timeout_s'"):
        load_config(config(tmp_path, "models: [{name: a, path: a.gguf, remote: [{url: 'http://h', timeout: 5}]}]\n"))


def test_remote_member_keys_come_from_the_environment_or_a_file_and_never_show(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("secret-from-file\n", encoding="utf-8")
    cfg = load_config(config(tmp_path, f"remote: [{{url: 'http://a/v1/', api_key_env: TEST_REMOTE_KEY}}, "
                                       f"{{url: 'http://b', api_key_file: '{key_file}'}}]\n"))
    with pytest.raises(ConfigError, match=r"remote\[0\].api_key_env: the environment variable TEST_REMOTE_KEY"):
        members(cfg.remote)
    monkeypatch.setenv("TEST_REMOTE_KEY", "secret-from-env")
    a, b = members(cfg.remote)
    assert (a.url, a.api_key, b.api_key) == ("http://a", "secret-from-env", "secret-from-file")
    assert "secret" not in repr(a) + repr(b)
    key_file.write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"remote\[1\].api_key_file: .* is empty"):
        members(cfg.remote)


def test_a_remote_only_fleet_needs_a_model_name(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "llamafleet.cli", "serve", "--config",
                           str(config(tmp_path, "remote: [{url: 'http://127.0.0.1:9'}]\n"))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "model_name: a fleet of remote members only" in done.stderr


def test_plan_shows_remote_members_and_places_nothing_for_them(tmp_path: Path, model_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    def plan(text: str) -> str:
        rc = main(["plan", "--config", str(config(tmp_path, text))])
        out, err = capsys.readouterr()
        assert rc == 0, err
        return out

    assert "served by remote members only: http://h:1 (max_concurrency 8)" in plan(
        "model_name: m\nremote: [{url: 'http://h:1'}]\n")
    several = plan(f"models: [{{name: a, path: '{model_path}'}}, {{name: b, remote: [{{url: 'http://h:1'}}]}}]\n")
    assert re.search(r"\n\s*b\s+yes\s+remote\s+1\s+-\s+http://h:1", several), several
    mixed = plan(f"model_path: {model_path}\nreplicas: 1\nremote: [{{url: 'http://h:1', max_concurrency: 3}}]\n")
    assert "replicas" in mixed and "remote members beside these replicas: http://h:1 (max_concurrency 3)" in mixed


def test_what_a_provider_that_is_not_llama_cpp_cannot_relay() -> None:
    provider = RemoteMember(url="https://api.example.com", model="m", llama_cpp=False)
    llama = RemoteMember(url="http://10.0.0.2:8080", model=None)
    plain = Submit("r", SamplingParams(temperature=0), chat=(("user", "hi"),))
    assert unrelayable(plain, provider) is None and unrelayable(plain, llama) is None
    grammar = Submit("r", SamplingParams(grammar='root ::= "a"'), prompt="x")
    assert "needs a llama.cpp upstream" in (unrelayable(grammar, provider) or "")
    assert unrelayable(grammar, llama) is None
    assert "top_k" in (unrelayable(Submit("r", SamplingParams(top_k=5), prompt="x"), provider) or "")
    for refused in (Submit("r", SamplingParams(max_tokens=0, prompt_logprobs=True), prompt="x"),
                    Submit("r", SamplingParams(), prompt="x", tokenize_only=True)):
        assert unrelayable(refused, llama)


def test_a_submit_becomes_one_streamed_upstream_request() -> None:
    params = SamplingParams(max_tokens=5, temperature=0, seed=7, stop=("\n",), top_k=5)
    member = RemoteMember(url="http://h", model=None)
    path, body = upstream_request(Submit("r", params, chat=(("user", "hi"),)), member, "up")
    assert path == "/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert body | {"messages": None} == {
        "model": "up", "stream": True, "stream_options": {"include_usage": True}, "temperature": 0, "top_p": 1.0,
        "max_tokens": 5, "seed": 7, "stop": ["\n"], "top_k": 5, "messages": None}  # knobs at defaults: not sent
    provider = RemoteMember(url="http://h", model=None, llama_cpp=False)
    path, body = upstream_request(Submit("r", params, prompt_ids=(1, 2)), provider, "up")
    assert path == "/v1/completions" and body["prompt"] == [1, 2] and "top_k" not in body


def test_an_upstream_stream_becomes_the_engines_outputs() -> None:
    reader = StreamReader("r")
    lines = ['data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}', "",
             'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}', ": keep-alive",
             'data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"tool_calls"}]}',
             'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,'
             '"prompt_tokens_details":{"cached_tokens":4}}}', "data: [DONE]"]
    outs = [o for o, _ in filter(None, map(reader.line, lines))]
    assert [o.text for o in outs] == ["Hel", "lo"] and reader.done
    last = reader.last()
    assert (last.finished, last.finish_reason, last.prompt_tokens, last.completion_tokens, last.cached_tokens) == (
        True, "stop", 9, 2, 4)
    with pytest.raises(UpstreamError, match="replica died"):
        StreamReader("r").line('data: {"error": {"message": "replica died", "code": 503}}')
    with pytest.raises(UpstreamError, match="not JSON"):
        StreamReader("r").line("data: <html>")


def test_a_relayed_streams_tokens_are_its_own_pieces_of_text() -> None:
    """No made-up placeholder: each content chunk is one token, whose id stands for its text in this stream."""
    reader = StreamReader("r")
    chunks = ["Hel", "lo", "Hel"]
    outs = [reader.line(f'data: {{"choices":[{{"index":0,"delta":{{"content":"{c}"}}}}]}}') for c in chunks]
    ids = [o[0].token_ids for o in outs if o is not None]
    assert ids == [[0], [1], [0]] and reader.ids == {b"Hel": 0, b"lo": 1}
    assert [o[0].completion_tokens for o in outs if o is not None] == [1, 2, 3]
    reader.line('data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}')
    assert reader.last().completion_tokens == 3  # the upstream sent no usage: one token per chunk


def test_a_members_spec_loads_no_model_and_brings_its_own_launcher() -> None:
    provider = RemoteMember(url="https://api.example.com", model="m", max_concurrency=3, llama_cpp=False)
    (spec,) = member_specs([provider], NO_CONTEXT_LIMIT, "chat on ")
    assert spec.engine is None and not spec.loads_model and spec.label == "chat on remote https://api.example.com"
    assert isinstance(spec.launcher, MemberLauncher) and spec.launcher.member is provider
    assert spec.refuses is not None and spec.refuses(Submit("r", SamplingParams(), prompt="x")) is None
    assert "llama.cpp upstream" in (spec.refuses(Submit("r", SamplingParams(ignore_eos=True), prompt="x")) or "")


@pytest.mark.parametrize(("status", "want"), [(400, 400), (404, 404), (429, 429), (401, 502), (403, 502),
                                              (500, 502), (503, 503), (504, 504)])
def test_upstream_errors_reach_the_client_with_a_status_that_says_whose_fault(status: int, want: int) -> None:
    got, text = upstream_failure(status, b'{"error": {"message": "nope"}}', "remote http://h")
    assert got == want and "remote http://h" in text and "nope" in text


def test_the_dispatcher_asks_each_spec_what_it_refuses() -> None:
    """A member's spec carries what it cannot relay: such a request goes to the local replicas only, and with no
    local replica it is refused before anything is routed."""
    provider = RemoteMember(url="https://api.example.com", model="m", llama_cpp=False)
    grammar = Submit("g", SamplingParams(grammar='root ::= "x"'), prompt="x")

    async def mixed(d: Dispatcher, reps: Replicas) -> None:
        reps.specs = [reps.specs[0], *member_specs([provider], NO_CONTEXT_LIMIT)]
        assert d.submit([grammar, Submit("g2", grammar.params, prompt="x")]).replicas == [0, 0]

    async def members_only(d: Dispatcher, reps: Replicas) -> None:
        reps.specs = member_specs([provider], NO_CONTEXT_LIMIT)
        with pytest.raises(Unservable, match="served by remote members only, and a grammar"):
            d.submit([grammar])
        assert reps.sent == []

    run(mixed, n_replicas=2)
    run(members_only, n_replicas=1)
