"""``llamafleet bench`` against the real server (the session's ``fleet``): two tiny runs, their files, --compare,
a refused request, and the in-process engine form on the real model."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import FleetServer
from llamafleet import cli

MAX_TOKENS = 8
PROMPT_WORDS = 16


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["bench", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def runs(fleet: FleetServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run A: text completions, 4 requests per level. Run B: chat, 0.5 s per level. Both at concurrency 1 and 4."""
    root = tmp_path_factory.mktemp("bench")
    results: dict[str, Any] = {"root": root}
    common = ["--url", fleet.url, "--concurrency", "1,4", "--max-tokens", str(MAX_TOKENS),
              "--prompt-tokens", str(PROMPT_WORDS), "--no-progress"]
    for label, extra in (("a", ["--requests", "4"]), ("b", ["--chat", "--duration", "0.5"])):
        rc = cli.main(["bench", *common, *extra, "--label", label, "--out", str(root / label)])
        if not (root / label / "bench.json").exists():
            pytest.fail(f"bench run {label} exited with {rc} and wrote no report; its error is in the captured stderr")
        results[label] = (rc, json.loads((root / label / "bench.json").read_text()))
    return results


def check_level(lv: dict[str, Any]) -> None:
    assert lv["errors"] == 0 and lv["ok"] == lv["requests"], lv["error_samples"]
    # ignore_eos was honoured and the server reported usage: every answer is exactly MAX_TOKENS long
    assert lv["output_tokens"] == MAX_TOKENS * lv["ok"]
    assert lv["usage_reported"] == lv["ok"] and lv["finished_early"] == 0
    for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "stream_tok_s"):
        d = lv[name]
        assert 0 < d["p50"] <= d["p90"] <= d["p99"], name
    assert lv["ttft_ms"]["p50"] < lv["e2e_ms"]["p50"]
    assert lv["output_tok_s"] > 0 and lv["requests_s"] > 0
    assert 0 < lv["client_cpu"] < 2  # the client measured its own CPU time
    # while every stream generates the rate should not fall below the whole level's, which also holds prompts and
    # ramps (half of it, as a generous margin for a shared 2-core machine)
    assert lv["steady_tok_s"] is None or lv["steady_tok_s"] >= 0.5 * lv["output_tok_s"]


def test_completions_run_report_and_files(runs: dict[str, Any], fleet: FleetServer) -> None:
    rc, rep = runs["a"]
    assert rc == 0
    assert rep["label"] == "a" and rep["config"]["model"] == fleet.model()  # found through /v1/models
    assert rep["config"]["endpoint"] == "/v1/completions" and rep["config"]["ignore_eos"] is True
    assert [lv["concurrency"] for lv in rep["levels"]] == [1, 4]
    for lv in rep["levels"]:
        assert lv["requests"] == 4
        check_level(lv)
        assert lv["prompt_tokens_mean"] == PROMPT_WORDS  # one token per synthetic word, as the server counted
    out = runs["root"] / "a"
    assert (out / "bench.md").read_text().count("\n| ") == 3  # header + a row per level
    for png in ("throughput.png", "ttft.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_chat_run_by_duration(runs: dict[str, Any]) -> None:
    rc, rep = runs["b"]
    assert rc == 0 and rep["config"]["endpoint"] == "/v1/chat/completions" and rep["config"]["duration_s"] == 0.5
    for lv in rep["levels"]:
        assert lv["requests"] >= lv["concurrency"]  # every worker sends at least one request before the deadline
        check_level(lv)
        assert lv["prompt_tokens_mean"] > PROMPT_WORDS  # the chat template adds its own tokens


def test_compare_prints_ratios(runs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    root = runs["root"]
    rc, out, _ = bench(capsys, "--compare", str(root / "a/bench.json"), str(root / "b/bench.json"))
    assert rc == 0
    assert "| concurrency | metric | a | b | b / a |" in out
    for c in (1, 4):
        for metric in ("output tok/s ↑", "TTFT p50 ms ↓", "E2E p50 ms ↓"):
            row = re.search(rf"^\| {c} \| {re.escape(metric)} \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|$", out, re.M)
            assert row is not None, (c, metric, out)
            a, b, ratio = (float(x) for x in row.groups())
            assert ratio == pytest.approx(b / a, rel=0.01, abs=0.006)


def test_unknown_model_stops_at_the_warmup_with_the_servers_answer(
        fleet: FleetServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = bench(capsys, "--url", fleet.url, "--model-name", "no-such-model", "--concurrency", "1", "--requests",
                       "1", "--max-tokens", "1", "--no-progress", "--out", str(tmp_path))
    assert rc == 1
    assert "the warm-up request" in err and "HTTP 4" in err and "no-such-model" in err
    assert not (tmp_path / "bench.json").exists()


def test_engine_form_on_the_real_model(model_path: Path, capsys: pytest.CaptureFixture[str],
                                       caplog: pytest.LogCaptureFixture) -> None:
    rc, out, _ = bench(capsys, "engine", "--model", str(model_path), "--requests", "3", "--max-tokens", "4",
                       "--threads", "1", "--json")
    assert rc == 0
    result = json.loads(out)
    phases = {p["name"]: p for p in result["phases"]}
    assert set(phases) == {"sequential", "concurrent"}
    assert all(p["requests"] == 3 and p["generated_tokens"] == 12 for p in phases.values())
    # one at a time takes a decode step per token of each answer; all at once shares the steps
    assert phases["sequential"]["steps"] >= 12 and phases["concurrent"]["steps"] < phases["sequential"]["steps"]
    # sized in llama.cpp's steps, the context divides evenly between the sequences: llama.cpp has nothing to say
    assert not [r for r in caplog.records if "not divisible" in r.getMessage()]
    assert result["model"] == model_path.name


def test_engine_form_with_speculation_prefills_both_sides_of_each_pair_in_alternating_order(
        model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each pair sends the same prompts with speculation off and on: without the prefix cache the second side
    would find them computed by the first and skip its prefill, which made a GPU run's pairs incomparable; and
    whichever side runs first pays for the second, so the order alternates from pair to pair."""
    rc, out, _ = bench(capsys, "engine", "--model", str(model_path), "--requests", "1", "--max-tokens", "2",
                       "--threads", "1", "--speculative", "ngram", "--workload", "edit", "--repeat", "2", "--json")
    assert rc == 0
    result = json.loads(out)
    phases = result["phases"]
    assert [p["name"] for p in phases] == ["sequential", "sequential+spec", "sequential+spec", "sequential",
                                           "concurrent", "concurrent+spec", "concurrent+spec", "concurrent"]
    assert result["pair_order"] == ["off, on", "on, off"]
    prefilled = [p["prefilled_tokens"] for p in phases]
    assert prefilled[0] > 100 and len(set(prefilled)) == 1, prefilled
    pairs = result["speculative_speedup_pairs"]
    by_name = {p["name"]: p["tokens_per_s"] for p in phases[6:]}  # the second concurrent pair: on, then off
    assert pairs["concurrent"][1] == pytest.approx(by_name["concurrent+spec"] / by_name["concurrent"])
