"""``llamafleet bench multiturn`` without a server: the conversations' bookkeeping (the history grows by the
answers the server returned), token counts, per-turn statistics, the prompt-cache hit rate read from ``usage``,
the report, --compare of replays, and the command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from test_bench_report import bench_cli

from llamafleet.bench import multiturn_report as mt_report
from llamafleet.bench import report as bench_report
from llamafleet.bench.loadgen import BenchConfig, LevelRun
from llamafleet.bench.multiturn import Conversation, MultiTurnConfig, MultiTurnRun
from llamafleet.bench.prompts import PromptSet
from llamafleet.bench.streaming import RequestResult
from llamafleet.commands import bench as bench_command

CFG = MultiTurnConfig(url="http://127.0.0.1:9", model="m", conversations=2, turns=3, system_tokens=8,
                      user_tokens=4, max_tokens=2, seed=7)


def answer(text: str, prompt: int = 20, cached: int | None = None, sent_at: float = 0.0, ttft: float = 0.1,
           ok: bool = True) -> RequestResult:
    return RequestResult(ok=ok, error=None if ok else "HTTP 500: boom", sent_at=sent_at, latency=ttft + 0.1,
                         chunk_times=[ttft, ttft + 0.1] if ok else [], output_tokens=2 if ok else 0,
                         prompt_tokens=prompt if ok else None, cached_tokens=cached, usage_reported=ok,
                         finish_reason="length" if ok else None, text=text)


def test_the_history_grows_by_the_servers_answers() -> None:
    conv = Conversation.make(CFG, 0)
    system, line1 = conv.system, conv.user_lines[0]
    assert len(system.split()) == 8 and all(len(u.split()) == 4 for u in conv.user_lines)  # one token per word
    first, body = conv.request(CFG)
    assert first == body["prompt"] == f"System: {system}\nUser: {line1}\nAssistant:"
    assert body["max_tokens"] == 2 and body["ignore_eos"] is True and body["stream_options"]["include_usage"]
    conv.record(first, answer(" an answer"))
    second, _ = conv.request(CFG)
    # the second prompt is the first, its answer exactly as returned, and the new line
    assert second == f"{first} an answer\nUser: {conv.user_lines[1]}\nAssistant:"
    conv.record(second, answer(" more"))
    third, _ = conv.request(CFG)
    assert isinstance(third, str) and third.startswith(f"{second} more\nUser: ")
    assert conv.answers == [" an answer", " more"] and not conv.finished
    conv.record(third, answer("!"))
    assert conv.finished and len(conv.turns) == 3


def test_chat_history_is_messages_with_the_answers() -> None:
    chat = MultiTurnConfig(**{**CFG.__dict__, "chat": True})
    conv = Conversation.make(chat, 1)
    first, body = conv.request(chat)
    assert first == body["messages"] == [{"role": "system", "content": conv.system},
                                         {"role": "user", "content": conv.user_lines[0]}]
    conv.record(first, answer("Hello there"))
    second, _ = conv.request(chat)
    assert second == [*first, {"role": "assistant", "content": "Hello there"},
                      {"role": "user", "content": conv.user_lines[1]}]


def test_a_failed_turn_ends_its_conversation() -> None:
    conv = Conversation.make(CFG, 0)
    prompt, _ = conv.request(CFG)
    conv.record(prompt, answer("", ok=False))
    assert conv.finished and conv.answers == [] and len(conv.turns) == 1


def test_texts_shared_and_distinct() -> None:
    a, b = Conversation.make(CFG, 0), Conversation.make(CFG, 1)
    assert a.system == b.system  # one system prompt for every conversation
    lines = a.user_lines + b.user_lines
    assert len(set(lines)) == len(lines)  # a different user line per conversation and turn
    assert Conversation.make(CFG, 0) == a  # the seed fixes the texts
    other = Conversation.make(MultiTurnConfig(**{**CFG.__dict__, "seed": 8}), 0)
    assert other.system != a.system
    none = Conversation.make(MultiTurnConfig(**{**CFG.__dict__, "system_tokens": 0}), 0)
    assert none.request(CFG)[0] == f"User: {none.user_lines[0]}\nAssistant:"


def test_config_checks() -> None:
    assert MultiTurnConfig(url="u", model="m", conversations=4).workers == 4
    assert MultiTurnConfig(url="u", model="m", conversations=4, concurrency=16).workers == 4
    assert MultiTurnConfig(url="u", model="m", conversations=4, concurrency=2).workers == 2
    for bad in ({"turns": 0}, {"conversations": 0}, {"user_tokens": 0}, {"system_tokens": -1}, {"concurrency": 0},
                {"max_tokens": 0}, {"deadline_s": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            MultiTurnConfig(url="u", model="m", **bad)  # type: ignore[arg-type]


def run_of(cached: bool) -> MultiTurnRun:
    """Two conversations of three turns; the second conversation's third turn failed. Turn 1 prompts are 20
    tokens (none cached), later ones 40 and 60 (all but the new 20 cached)."""
    convs = [Conversation.make(CFG, i) for i in range(2)]
    for i, conv in enumerate(convs):
        for t in range(3):
            prompt, _ = conv.request(CFG)
            failed = i == 1 and t == 2
            conv.record(prompt, answer(f" a{t}", prompt=20 * (t + 1), cached=20 * t if cached else None,
                                       sent_at=float(t), ttft=0.1 * (3 - t), ok=not failed))
    return MultiTurnRun(convs, wall_seconds=4.0, client_cpu_share=0.1)


def test_per_turn_statistics_and_hit_rate() -> None:
    rep = mt_report.build_report(CFG, run_of(cached=True), "A")
    t1, t2, t3 = rep["turns"]
    assert [t["turn"] for t in rep["turns"]] == [1, 2, 3] and rep["overall"]["turn"] == "all"
    assert (t1["requests"], t1["ok"], t3["requests"], t3["ok"], t3["errors"]) == (2, 2, 2, 1, 1)
    assert t3["error_samples"] == ["HTTP 500: boom"]
    assert t1["cache_hit"] == 0.0 and t2["cache_hit"] == pytest.approx(0.5)
    assert t2["prompt_tokens_mean"] == 40 and t2["cached_tokens"] == 40 and t2["cache_reported"] == 2
    assert t1["ttft_ms"] is not None and t1["ttft_ms"]["p50"] == pytest.approx(300.0)
    assert t3["ttft_ms"] is not None and t3["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert t2["span_s"] == pytest.approx(0.3) and t2["output_tok_s"] == pytest.approx(4 / 0.3)
    every = rep["overall"]
    assert (every["requests"], every["ok"], every["span_s"], every["output_tokens"]) == (6, 5, 4.0, 10)
    assert every["cache_hit"] == pytest.approx((0 + 20 + 40 + 0 + 20) / (20 + 40 + 60 + 20 + 40))
    assert rep["not_sent"] == 0 and rep["wall_s"] == 4.0 and rep["config"]["seed"] == 7
    sample = rep["sample"]
    assert [s["answer"] for s in sample] == [" a0", " a1", " a2"]
    assert sample[1]["prompt"].startswith(sample[0]["prompt"] + sample[0]["answer"] + "\nUser: ")
    md = mt_report.markdown(rep)
    assert "| 2 | 2 | 0 | 40.0 | 50.0% | 13.3 | 200.0 / 200.0 | 300.0 / 300.0 | 0.30 |" in md
    assert "| all | 6 | 1 | " in md and "Wall time of the replay: 4.00 s" in md
    assert "- turn 3: 1 errors, e.g. HTTP 500: boom" in md and "n/a" not in md


def test_hit_rate_is_na_without_the_field() -> None:
    rep = mt_report.build_report(CFG, run_of(cached=False), "A")
    assert all(t["cache_hit"] is None and t["cached_tokens"] is None for t in [*rep["turns"], rep["overall"]])
    md = mt_report.markdown(rep)
    assert "| 1 | 2 | 0 | 20.0 | n/a |" in md
    assert "prompt cache hit n/a: the server's usage carries no prompt_tokens_details.cached_tokens" in md
    # some answers with the field, some without: the rate is over those that have it, and says so
    conv = run_of(cached=False).conversations
    conv[0].turns[1].result.cached_tokens = 30
    rep = mt_report.build_report(CFG, MultiTurnRun(conv, 4.0), "A")
    assert rep["turns"][1]["cache_hit"] == pytest.approx(30 / 40) and rep["turns"][1]["cache_reported"] == 1
    assert "turn 2: cached tokens reported for 1 of 2 answers" in mt_report.markdown(rep)


def test_not_sent_turns_are_counted() -> None:
    convs = [Conversation.make(CFG, i) for i in range(2)]
    prompt, _ = convs[0].request(CFG)
    convs[0].record(prompt, answer("", ok=False))
    rep = mt_report.build_report(CFG, MultiTurnRun(convs, 1.0), "A")
    assert rep["not_sent"] == 5 and rep["turns"][1]["requests"] == 0 and rep["turns"][1]["ttft_ms"] is None
    assert "5 turns not sent" in mt_report.markdown(rep)


def test_compare_replays_and_refuse_mixed_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cold = mt_report.build_report(CFG, run_of(cached=False), "cold")
    warm = mt_report.build_report(CFG, run_of(cached=True), "warm")
    for rep in (cold, warm):
        mt_report.write_report(rep, tmp_path / rep["label"])
    assert json.loads((tmp_path / "warm/bench.json").read_text())["schema"] == bench_report.MULTITURN_SCHEMA
    rc = bench_cli("--compare", str(tmp_path / "warm/bench.json"), str(tmp_path / "cold/bench.json"),
                   "--out", str(tmp_path / "cmp"))
    out = capsys.readouterr().out
    assert rc == 0 and "| turn | metric | warm | cold | cold / warm |" in out
    assert "| 2 | prompt cache hit ↑ | 0.500 | — | — |" in out
    assert "| all | TTFT p50 ms ↓ | 200.00 | 200.00 | 1.00x |" in out
    assert "| all | span s ↓ | 4.000 | 4.000 | 1.00x |" in out
    assert [f.name for f in (tmp_path / "cmp").iterdir()] == ["compare.md"]  # no plots for replays
    sweep_cfg = BenchConfig(url="u", model="m", concurrency=(1,), requests=1)
    sweep = bench_report.build_report(sweep_cfg, PromptSet(words=4), [LevelRun(1, 1.0, [])], "s")
    bench_report.write_report(sweep, tmp_path / "sweep")
    for order in ((tmp_path / "sweep", tmp_path / "warm"), (tmp_path / "warm", tmp_path / "sweep")):
        assert bench_cli("--compare", *(str(p / "bench.json") for p in order)) == 1
        assert "report was expected; --compare lines up reports of one kind" in capsys.readouterr().err


def test_multiturn_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="llamafleet")
    bench_command.register(parser.add_subparsers())
    args = parser.parse_args(["bench", "multiturn"])
    assert (args.conversations, args.turns, args.system_tokens, args.user_tokens, args.seed) == (32, 4, 1300, 25, None)
    # server flags may come before or after the form's name; --turns 1 is the shared-prefix case
    args = parser.parse_args(["bench", "--url", "http://x", "--chat", "multiturn", "--turns", "1", "--max-tokens", "9"])
    assert (args.url, args.chat, args.turns, args.max_tokens, args.func) == ("http://x", True, 1, 9,
                                                                               bench_command.run_multiturn)
    assert bench_cli("--requests", "3", "multiturn") == 1
    assert "--requests cannot be used with `llamafleet bench multiturn`" in capsys.readouterr().err
    assert bench_cli("multiturn", "--concurrency", "1,8") == 1
    assert "runs one level (conversations at once), got 1,8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_cli("multiturn", "--prompts", "p.txt")
    assert "unrecognized arguments: --prompts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_cli("--conversations", "3")  # a multiturn flag is not the sweep's
    capsys.readouterr()
