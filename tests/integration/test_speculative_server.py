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
from scrape import metric, scrape

from conftest import FleetServer, free_port
from llamafleet.bench.workloads import edit_prompt

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
    totals = httpx.get(f"{server.url}/v1/status", timeout=30).json()["totals"]
    assert totals["draft_tokens"] == drafted and totals["draft_accepted_tokens"] == accepted
    assert totals["draft_acceptance"] == pytest.approx(accepted / drafted)


@pytest.mark.parametrize(("line", "named"), [("max_draft: 0", "speculative.max_draft"),
                                             ("max_draft: 65", "speculative.max_draft"),
                                             ("mode: draft", "speculative.mode"),
                                             ("ngram_min: 5", "ngram_min")])
def test_bad_speculative_settings_are_refused_naming_the_key(model_path: Path, tmp_path: Path, line: str,
                                                            named: str) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(f"model_path: {model_path}\nspeculative:\n  {line}\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "llamafleet.cli", "serve", "--config", str(config),
                           "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr, proc.stderr
