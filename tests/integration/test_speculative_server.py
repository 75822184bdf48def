"""Speculative decoding through the server, with the OpenAI SDK: the config turns it on (a bad max_draft is refused
naming the key), answers stream token by token, the usage counts drafts (OpenAI's accepted/rejected prediction
tokens), a request may opt out, and /metrics and /v1/status add the counts up."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from browser import Browser
from scrape import metric, scrape

from conftest import FleetServer, free_port
from llamafleet.bench.workloads import edit_prompt
from llamafleet.model.synth import SHAPES, find_vocab, write_model

SPEC = "speculative:\n  mode: ngram\n  max_draft: 6\n  draft_cost: 0\n"  # draft whenever a draft is found


@pytest.fixture(scope="module")
def server(launch_fleet: Callable[[list[str]], FleetServer], model_path: Path,
           tmp_path_factory: pytest.TempPathFactory) -> FleetServer:
    config = tmp_path_factory.mktemp("spec") / "fleet.yaml"
    config.write_text(SPEC, encoding="utf-8")
    s = launch_fleet(["--config", str(config), "--model", str(model_path), "--replicas", "1", "--parallel", "2",
                      "--ctx", "1024", "--threads", "1"])
    s.wait_ready()
    return s


def test_drafts_are_counted_in_usage_metrics_and_status_and_a_request_can_opt_out(server: FleetServer) -> None:
    client, model = server.client(), server.model()
    prompt = edit_prompt(0).text
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=40, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 40
    details = usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens and details.accepted_prediction_tokens > 0
    assert details.rejected_prediction_tokens is not None
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len([t for t in texts if t]) > 20  # kept drafts still reach the client one token at a time

    out = client.completions.create(model=model, prompt=prompt, max_tokens=40, temperature=0,
                                    extra_body={"speculative": False})
    assert out.usage is not None and out.usage.completion_tokens_details is not None
    assert out.usage.completion_tokens_details.accepted_prediction_tokens == 0
    assert out.usage.completion_tokens_details.rejected_prediction_tokens == 0

    text = scrape(server.url)
    drafted = metric(text, "llamafleet_draft_tokens_total")
    accepted = metric(text, "llamafleet_draft_accepted_tokens_total")
    assert accepted == details.accepted_prediction_tokens
    assert drafted == accepted + details.rejected_prediction_tokens
    assert metric(text, "llamafleet_draft_rejected_tokens_total") == details.rejected_prediction_tokens
    status = httpx.get(f"{server.url}/v1/status", timeout=30).json()
    totals = status["totals"]
    assert totals["draft_tokens"] == drafted and totals["draft_accepted_tokens"] == accepted
    assert totals["draft_acceptance"] == pytest.approx(accepted / drafted)
    replica = status["replicas"][0]  # the engine's own counts, as its last stats report had them
    assert 0 < replica["draft_accepted_tokens"] <= replica["draft_tokens"] <= drafted
    assert replica["draft_acceptance"] == pytest.approx(replica["draft_accepted_tokens"] / replica["draft_tokens"])


def test_the_dashboard_shows_the_drafts_kept(server: FleetServer, tmp_path: Path) -> None:
    client = server.client()
    client.completions.create(model=server.model(), prompt=edit_prompt(1).text, max_tokens=24, temperature=0)
    with Browser(tmp_path / "chromium") as b:
        b.goto(f"{server.url}/ui")
        b.wait_for("document.getElementById('spec-acceptance').textContent.endsWith('%')")
        b.wait_for("document.querySelector('#replicas td.drafts')?.textContent.endsWith('%')")
        assert "drafted tokens kept" in b.text("#spec-tokens")
        assert b.errors == []


@pytest.mark.parametrize(("line", "named"), [("max_draft: 0", "speculative.max_draft"),
                                             ("max_draft: 65", "speculative.max_draft"),
                                             ("mode: eagle", "speculative.mode"),
                                             ("mode: draft", "mode draft needs draft_model"),
                                             ("ngram_min: 5", "ngram_min")])
def test_bad_speculative_settings_are_refused_naming_the_key(model_path: Path, tmp_path: Path, line: str,
                                                            named: str) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(f"model_path: {model_path}\nspeculative:\n  {line}\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "llamafleet.cli", "serve", "--config", str(config),
                           "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr, proc.stderr


def test_a_draft_model_serves_and_one_of_another_vocabulary_stops_the_server_saying_why(
        launch_fleet: Callable[[list[str]], FleetServer], model_path: Path, tmp_path: Path) -> None:
    """The demo model as its own draft (nearly every draft kept); a LLaMA-2-vocabulary draft refused at load."""
    config = tmp_path / "draft.yaml"
    config.write_text(f"speculative:\n  mode: draft\n  draft_model: {model_path}\n  draft_cost: 0\n", encoding="utf-8")
    s = launch_fleet(["--config", str(config), "--model", str(model_path), "--replicas", "1", "--parallel", "1",
                      "--ctx", "512", "--threads", "1"])
    s.wait_ready()
    try:
        out = s.client().completions.create(model=s.model(), prompt="Count from one to ten: one, two,", max_tokens=16,
                                            temperature=0)
        details = out.usage.completion_tokens_details if out.usage else None
        assert details is not None and details.accepted_prediction_tokens and details.accepted_prediction_tokens > 0
    finally:
        s.stop()
    other = write_model(tmp_path / "micro-llama.gguf", SHAPES["micro"], "q8_0", find_vocab(), progress=False)
    config.write_text(f"model_path: {model_path}\nspeculative:\n  mode: draft\n  draft_model: {other}\n",
                      encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "llamafleet.cli", "serve", "--config", str(config), "--threads", "1",
                           "--parallel", "1", "--ctx", "512", "--port", str(free_port())],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "its vocabulary is not the served model's (it has 32000 tokens, the model 49152)" in proc.stderr
