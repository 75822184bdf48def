"""``llamafleet bench`` without a server: stream parsing, prompts, statistics, report files and --compare."""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path

import pytest
from matplotlib.image import imread

from llamafleet.bench import report as bench_report
from llamafleet.bench.loadgen import BenchConfig, LevelRun, request_body
from llamafleet.bench.prompts import Prompt, PromptFileError, PromptSet, load_prompts
from llamafleet.bench.streaming import BenchError, RequestResult, resolve_model
from llamafleet.bench.workloads import workload_prompts
from llamafleet.commands import bench as bench_command


def bench_cli(*argv: str) -> int:
    """``llamafleet bench ARGV`` through the command's own parser (other commands stay out of these tests)."""
    parser = argparse.ArgumentParser(prog="llamafleet")
    bench_command.register(parser.add_subparsers())
    args = parser.parse_args(["bench", *argv])
    rc: int = args.func(args)
    return rc


CFG = BenchConfig(url="http://127.0.0.1:9/v1", model="m", concurrency=(1, 2), requests=3, max_tokens=4)


def result(chunks: list[float], tokens: int, latency: float, usage: bool = True) -> RequestResult:
    return RequestResult(ok=True, latency=latency, chunk_times=chunks, output_tokens=tokens, prompt_tokens=10,
                         usage_reported=usage, finish_reason="length" if tokens == 4 else "stop")


def level_two() -> LevelRun:
    """Two answers and one failure in 2 s: 4 tokens at 0.1 s steps, 3 tokens at 0.2 s steps."""
    failed = RequestResult(ok=False, error="HTTP 503: busy", latency=0.05)
    return LevelRun(2, 2.0, [result([0.1, 0.2, 0.3, 0.4], 4, 0.5), result([0.2, 0.4, 0.6], 3, 0.7), failed])


def test_level_statistics() -> None:
    lv = bench_report.summarize(level_two(), max_tokens=4)
    assert (lv["requests"], lv["ok"], lv["errors"]) == (3, 2, 1)
    assert lv["error_samples"] == ["HTTP 503: busy"]
    assert lv["output_tokens"] == 7 and lv["output_tok_s"] == pytest.approx(3.5)
    assert lv["requests_s"] == pytest.approx(1.0)
    assert lv["finished_early"] == 1 and lv["usage_reported"] == 2 and lv["prompt_tokens_mean"] == 10
    assert lv["ttft_ms"] == pytest.approx({"mean": 150.0, "p50": 150.0, "p90": 190.0, "p99": 199.0})
    # gaps 100,100,100 and 200,200: sorted position 0.9 * 4 = 3.6 lies between two 200s
    assert lv["itl_ms"] == pytest.approx({"mean": 140.0, "p50": 100.0, "p90": 200.0, "p99": 200.0})
    assert lv["tpot_ms"] == pytest.approx({"mean": 150.0, "p50": 150.0, "p90": 190.0, "p99": 199.0})
    assert lv["stream_tok_s"] == pytest.approx({"mean": 7.5, "p50": 7.5, "p90": 9.5, "p99": 9.95})
    assert lv["e2e_ms"] == pytest.approx({"mean": 600.0, "p50": 600.0, "p90": 680.0, "p99": 698.0})


def test_level_with_only_failures_has_no_distributions() -> None:
    run = LevelRun(4, 1.0, [RequestResult(error="ConnectError")] * 4)
    lv = bench_report.summarize(run, max_tokens=4)
    assert lv["ok"] == 0 and lv["errors"] == 4 and lv["output_tok_s"] == 0.0
    assert lv["ttft_ms"] is None and lv["stream_tok_s"] is None and lv["prompt_tokens_mean"] is None
    assert "| 4 | 4 | 4 | 0.00 | 0.0 | — | — | — | — | — | 0% |" in bench_report.markdown(report_of([run]))


def report_of(runs: list[LevelRun], label: str = "A") -> bench_report.Report:
    return bench_report.build_report(CFG, PromptSet(words=16), runs, label)


def test_markdown_table_and_notes() -> None:
    md = bench_report.markdown(report_of([level_two()]))
    row = next(line for line in md.splitlines() if line.startswith("| 2 | 3 | 1 | 1.00 | 3.5 | "))
    assert row.endswith("| 7.5 | 150.0 / 190.0 / 199.0 | 100.0 / 200.0 / 200.0 | 600.0 / 680.0 / 698.0 | 0% |")
    assert "1 of 2 answers ended before max_tokens" in md
    assert "1 errors, e.g. HTTP 503: busy" in md


def test_steady_rate_counts_only_while_every_stream_generates() -> None:
    # stream 1 generates from t=1 to t=4, stream 2 (sent at 0.5) from 1.5 to 3.5: both run over (1.5, 3.5], where
    # stream 1 delivers its chunks at 2 and 3 and stream 2 its chunks at 2.5 and 3.5: 4 tokens in 2 s
    one = result([1.0, 2.0, 3.0, 4.0], 4, 4.0)
    two = RequestResult(ok=True, sent_at=0.5, latency=3.0, chunk_times=[1.0, 2.0, 3.0], output_tokens=3)
    assert bench_report.steady_rate([one, two], concurrency=2, wall=4.0) == pytest.approx(2.0)
    # a stream whose 3 chunks carried 6 tokens weighs 2 tokens per chunk: (2 x 1 + 2 x 2) tokens in 2 s
    three = RequestResult(ok=True, sent_at=0.5, chunk_times=[1.0, 2.0, 3.0], output_tokens=6)
    assert bench_report.steady_rate([one, three], concurrency=2, wall=4.0) == pytest.approx(3.0)
    assert bench_report.steady_rate([one, two], concurrency=3, wall=4.0) is None  # never 3 streams at once
    assert bench_report.steady_rate([one, two], concurrency=2, wall=30.0) is None  # 2 s of 30: too short to tell


def test_busy_client_is_flagged() -> None:
    run = LevelRun(1, 1.0, [result([0.1, 0.2], 2, 0.3)], client_cpu_share=0.93)
    assert "the client was busy 93% of the time" in bench_report.markdown(report_of([run]))


def test_chunk_counted_tokens_are_flagged() -> None:
    run = LevelRun(1, 1.0, [result([0.1, 0.2], 2, 0.3, usage=False)])
    assert "token counts from counted chunks" in bench_report.markdown(report_of([run]))


def test_report_files(tmp_path: Path) -> None:
    rep = report_of([LevelRun(1, 1.0, [result([0.1, 0.2, 0.3, 0.4], 4, 0.5)]), level_two()])
    files = bench_report.write_report(rep, tmp_path / "run")
    assert [f.name for f in files] == ["bench.json", "bench.md", "throughput.png", "ttft.png"]
    saved = json.loads(files[0].read_text())
    assert saved == json.loads(json.dumps(rep))
    assert saved["config"]["endpoint"] == "/v1/completions" and "api_key" not in saved["config"]
    assert [lv["concurrency"] for lv in saved["levels"]] == [1, 2]
    for png in files[2:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert imread(png).shape[:2] == (495, 770)  # 7 x 4.5 inches at 110 dpi
    assert bench_report.load_report(files[0]) == saved


def test_load_report_names_the_file_and_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="x.json: not JSON"):
        bench_report.load_report(bad)
    bad.write_text('{"phases": []}')
    with pytest.raises(ValueError, match="not a llamafleet bench report"):
        bench_report.load_report(bad)
    bad.write_text(json.dumps({"schema": bench_report.SCHEMA, "levels": [{}]}))
    with pytest.raises(ValueError, match="field 'levels'"):
        bench_report.load_report(bad)
    with pytest.raises(ValueError, match="cannot read"):
        bench_report.load_report(tmp_path / "missing.json")


def test_compare_ratios_against_the_first() -> None:
    base = report_of([LevelRun(1, 1.0, [result([0.1, 0.2, 0.3, 0.4], 4, 0.5)]), level_two()], "single")
    faster = report_of([LevelRun(1, 0.5, [result([0.05, 0.1, 0.15, 0.2], 4, 0.25)])], "double")
    md = bench_report.compare_markdown([base, faster])
    assert "| concurrency | metric | single | double | double / single |" in md
    assert "| 1 | output tok/s ↑ | 4.000 | 8.000 | 2.00x |" in md
    assert "| 1 | TTFT p50 ms ↓ | 100.00 | 50.00 | 0.50x |" in md
    per_stream = next(line for line in md.splitlines() if line.startswith("| 1 | tok/s per stream p50 ↑ |"))
    assert per_stream.endswith("| 2.00x |")
    assert "| 2 | output tok/s ↑ | 3.500 | — | — |" in md  # level 2 was not measured in the second run
    assert "| 2 | errors | 1 | — | |" in md
    with pytest.raises(ValueError, match="at least two"):
        bench_report.compare_markdown([base])


def test_compare_cli_writes_table_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, wall in (("a", 2.0), ("b", 1.0)):
        bench_report.write_report(report_of([LevelRun(2, wall, level_two().results)]), tmp_path / name)
    rc = bench_cli("--compare", str(tmp_path / "a/bench.json"), str(tmp_path / "b/bench.json"),
                   "--out", str(tmp_path / "cmp"))
    out = capsys.readouterr().out
    assert rc == 0
    assert "| A (a) | A (b) | A (b) / A (a) |" in out  # same label twice: the folder names tell them apart
    assert "| 2 | output tok/s ↑ | 3.500 | 7.000 | 2.00x |" in out
    assert (tmp_path / "cmp/compare.md").read_text() in out
    assert (tmp_path / "cmp/throughput.png").stat().st_size > 1000


def test_each_form_takes_only_its_own_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):  # engine has a parser of its own: HTTP flags are unknown there
        bench_cli("engine", "--concurrency", "4", "--chat")
    assert "unrecognized arguments: --concurrency 4 --chat" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_cli("--json")
    assert "unrecognized arguments: --json" in capsys.readouterr().err
    assert bench_cli("--chat", "engine") == 1  # given before 'engine': parsed by the HTTP form, then refused
    assert "--chat cannot be used with `llamafleet bench engine`" in capsys.readouterr().err
    assert bench_cli("--compare", "a.json", "b.json", "--chat") == 1
    assert "--chat cannot be used with --compare" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_cli("--concurrency", "1,zero")
    assert "expected comma-separated positive integers" in capsys.readouterr().err


def test_bench_engine_help_shows_only_engine_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_cli("engine", "--help")
    out = capsys.readouterr().out
    assert "--model FILE" in out and "GGUF model file" in out and "--batch" in out and "--no-overlap" in out
    assert not any(flag in out for flag in ("--url", "--concurrency", "--chat", "--model-name", "--compare"))


def http_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llamafleet")
    bench_command.register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_http_form_names_the_served_model_with_model_name(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    assert bench_command.served_model_name(http_args("--model-name", "m1")) == "m1"
    assert bench_command.served_model_name(http_args("http", "--model-name", "m1")) == "m1"
    assert capsys.readouterr().err == ""
    # the older spelling still works, and says what it is now called
    assert bench_command.served_model_name(http_args("--url", "http://x", "--model", "m2")) == "m2"
    assert "--model-name m2" in capsys.readouterr().err
    # a GGUF file there is a mix-up with `bench engine --model FILE`, said as such
    gguf = tmp_path / "model.gguf"
    with pytest.raises(ValueError, match="bench engine --model FILE"):
        bench_command.served_model_name(http_args("--model", str(gguf)))
    with pytest.raises(ValueError, match="keep --model-name"):
        bench_command.served_model_name(http_args("--model", "a", "--model-name", "b"))


def test_flags_before_http_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    args = http_args("--url", "http://x", "--chat", "http", "--requests", "3")
    assert (args.url, args.chat, args.requests, args.form) == ("http://x", True, 3, "http")


def test_request_bodies() -> None:
    body = request_body(CFG, Prompt(text="hello"))
    assert body["prompt"] == "hello" and body["stream"] and body["temperature"] == 0.0
    assert body["ignore_eos"] is True and body["stream_options"] == {"include_usage": True}
    chat = BenchConfig(url="u", model="m", chat=True)
    assert request_body(chat, Prompt(text="hi"))["messages"] == [{"role": "user", "content": "hi"}]
    msgs = Prompt(messages=(("system", "be brief"), ("user", "hi")))
    assert request_body(chat, msgs)["messages"][0] == {"role": "system", "content": "be brief"}
    with pytest.raises(BenchError, match="needs --chat"):
        request_body(CFG, msgs)


def test_config_checks_and_defaults() -> None:
    assert BenchConfig(url="u", model="m").requests_for(1) == 16
    assert BenchConfig(url="u", model="m").requests_for(32) == 128
    assert BenchConfig(url="u", model="m", duration=5).requests_for(8) is None
    with pytest.raises(ValueError, match="not both"):
        BenchConfig(url="u", model="m", requests=3, duration=1.0)
    with pytest.raises(ValueError, match="concurrency"):
        BenchConfig(url="u", model="m", concurrency=(0,))


def test_synthetic_prompts_are_distinct_and_sized() -> None:
    ps = PromptSet(words=64)
    assert ps.get(3) == ps.get(3) and ps.get(3) != ps.get(4)
    assert len(ps.get(0).text.split()) == 64


def test_workload_prompts_differ_for_every_request() -> None:
    """A level of 128 streams sends 512 requests: prompts cycled every 32 let a server's prefix cache answer most of
    them from earlier ones."""
    edit = workload_prompts("edit")
    assert len({edit.get(i).text for i in range(-4, 600)}) == 604  # (the warm-up's indices are negative)
    assert edit.get(7) == edit.get(7)
    extract = workload_prompts("extract")  # 8 paragraphs in a drawn order: a repeat among hundreds is rare
    assert sum(extract.get(i) == extract.get(i + 32) for i in range(64)) == 0


def test_prompt_files(tmp_path: Path) -> None:
    jl = tmp_path / "p.jsonl"
    jl.write_text('"plain"\n\n{"prompt": "p"}\n{"messages": [{"role": "user", "content": "c"}]}\n')
    ps = load_prompts(jl)
    assert [p.text for p in ps.prompts[:2]] == ["plain", "p"] and ps.prompts[2].messages == (("user", "c"),)
    assert ps.get(4) == ps.prompts[1] and "3 prompts" in ps.describe()
    txt = tmp_path / "p.txt"
    txt.write_text("one\n{\"not\": \"parsed\"}\n")
    assert [p.text for p in load_prompts(txt).prompts] == ["one", '{"not": "parsed"}']
    jl.write_text('"ok"\n{"messages": []}\n')
    with pytest.raises(PromptFileError, match="p.jsonl line 2: 'messages' must be"):
        load_prompts(jl)
    jl.write_text("\n")
    with pytest.raises(PromptFileError, match="holds no prompts"):
        load_prompts(jl)


def test_unreachable_server_is_named_with_the_fix() -> None:
    with socket.socket() as s:  # a port that was just free: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BenchError, match=rf"cannot reach http://127.0.0.1:{port}/v1/models .*fix --url"):
        resolve_model(f"http://127.0.0.1:{port}", None, timeout=5.0)
