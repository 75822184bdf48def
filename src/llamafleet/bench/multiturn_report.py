"""Statistics, files and comparisons of ``llamafleet bench multiturn`` replays (:mod:`llamafleet.bench.multiturn`).

Per turn (turn 1 of every conversation, turn 2 of every conversation, ...) and over all turns, over successful
requests, latencies in milliseconds as the client sees them:

- ``ttft_ms``, ``itl_ms``, ``e2e_ms``: as in a concurrency sweep (:mod:`llamafleet.bench.report`), with mean, p50,
  p90 and p99. Per-turn TTFT shows whether later turns, whose prompts start with the earlier ones, are served from
  the server's prefix cache;
- ``cache_hit``: prompt tokens the server took from its cache / prompt tokens, both from the server's ``usage``
  (``prompt_tokens_details.cached_tokens``, OpenAI's field, and ``prompt_tokens``) over the requests that reported
  the field; ``None`` (shown as n/a) when none did: it is never estimated;
- ``output_tok_s``: generated tokens / ``span_s``, where a turn's span runs from its first request sent to its last
  answer (turns of different conversations overlap when they drift apart) and the whole replay's is its wall time.

Files: ``bench.json`` (schema :data:`~llamafleet.bench.report.MULTITURN_SCHEMA`, with the first conversation's
prompts and answers as sent and received, under ``sample``) and ``bench.md``. :func:`compare_markdown` lines up
replays turn by turn, with ratios against the first, as ``llamafleet bench --compare`` does for sweeps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast

from llamafleet.bench.multiturn import MultiTurnConfig, MultiTurnRun
from llamafleet.bench.report import (
    CLIENT_BUSY,
    COMPARE_FOOT,
    MULTITURN_SCHEMA,
    Dist,
    Outcome,
    RunInfo,
    compare_head,
    compare_rows,
    outcome,
    read_report,
    run_info,
)
from llamafleet.bench.streaming import RequestResult


class TurnStats(Outcome):
    turn: int | Literal["all"]
    span_s: float
    output_tok_s: float
    prompt_tokens: int  # over the answers that reported cached_tokens: the hit rate's denominator
    cached_tokens: int | None
    cache_reported: int  # answers whose usage carried prompt_tokens_details.cached_tokens
    cache_hit: float | None


class MultiTurnReport(RunInfo):
    wall_s: float
    client_cpu: float
    not_sent: int  # turns never sent because an earlier turn of their conversation failed
    turns: list[TurnStats]
    overall: TurnStats
    sample: list[dict[str, Any]]


def summarize(turn: int | Literal["all"], results: Sequence[RequestResult], max_tokens: int,
              span: float | None = None) -> TurnStats:
    """One turn's numbers (or all turns', with ``turn`` "all" and the replay's wall time as ``span``)."""
    if span is None:
        span = max((r.sent_at + r.latency for r in results), default=0.0) - min((r.sent_at for r in results),
                                                                                  default=0.0)
    base = outcome(results, max_tokens)
    cached = [(r.cached_tokens, r.prompt_tokens or 0) for r in results if r.ok and r.cached_tokens is not None]
    prompt_total = sum(p for _, p in cached)
    return TurnStats(
        turn=turn, **base, span_s=span, output_tok_s=base["output_tokens"] / span if span > 0 else 0.0,
        prompt_tokens=prompt_total, cached_tokens=sum(c for c, _ in cached) if cached else None,
        cache_reported=len(cached),
        cache_hit=sum(c for c, _ in cached) / prompt_total if cached and prompt_total else None,
    )


def build_report(cfg: MultiTurnConfig, run: MultiTurnRun, label: str) -> MultiTurnReport:
    """The replay as one JSON-ready report (the API key is never written)."""
    config = {
        "url": cfg.url, "model": cfg.model, "endpoint": cfg.endpoint, "conversations": cfg.conversations,
        "turns": cfg.turns, "system_tokens": cfg.system_tokens, "user_tokens": cfg.user_tokens,
        "private_tokens": cfg.private_tokens, "by_turn": cfg.by_turn, "deadline_s": cfg.deadline_s,
        "max_tokens": cfg.max_tokens,
        "concurrency": cfg.workers, "seed": cfg.seed, "temperature": 0.0,
        "ignore_eos": cfg.ignore_eos, "warmup": cfg.warmup,
    }
    sample = [{"turn": t + 1, "prompt": rec.prompt, "answer": rec.result.text, "ok": rec.result.ok,
               "prompt_tokens": rec.result.prompt_tokens, "cached_tokens": rec.result.cached_tokens}
              for t, rec in enumerate(run.conversations[0].turns)]
    sent = run.results()
    return MultiTurnReport(
        **run_info(MULTITURN_SCHEMA, label, config), wall_s=run.wall_seconds,
        client_cpu=run.client_cpu_share, not_sent=cfg.conversations * cfg.turns - len(sent),
        turns=[summarize(t + 1, run.results(t), cfg.max_tokens) for t in range(cfg.turns)],
        overall=summarize("all", sent, cfg.max_tokens, span=run.wall_seconds), sample=sample,
    )


def _two(d: Dist | None) -> str:
    return "—" if d is None else f"{d['p50']:.1f} / {d['p99']:.1f}"


def _hit(row: TurnStats) -> str:
    return "n/a" if row["cache_hit"] is None else f"{100 * row['cache_hit']:.1f}%"


def describe(report: MultiTurnReport) -> str:
    cfg = report["config"]
    private = f" + {cfg['private_tokens']} private" if cfg.get("private_tokens") else ""  # (older reports: none)
    order = ", turn by turn" if cfg.get("by_turn") else ""
    return (f"{cfg['model']} at {cfg['url']} ({cfg['endpoint']}, {cfg['conversations']} conversations x "
            f"{cfg['turns']} turns, system prompt {cfg['system_tokens']}{private} + user lines {cfg['user_tokens']} "
            "words, "
            f"max_tokens {cfg['max_tokens']}, concurrency {cfg['concurrency']}{order}, seed {cfg['seed']})")


def markdown(report: MultiTurnReport) -> str:
    """The report's table: one row per turn and one for all turns, then the wall time and notes."""
    lines = [
        f"### {report['label']}: {describe(report)}", "",
        "| turn | requests | errors | prompt tokens mean | prompt cache hit | output tok/s | TTFT ms p50 / p99 "
        "| E2E ms p50 / p99 | span s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [*report["turns"], report["overall"]]
    for row in rows:
        mean = "—" if row["prompt_tokens_mean"] is None else f"{row['prompt_tokens_mean']:.1f}"
        lines.append(f"| {row['turn']} | {row['requests']} | {row['errors']} | {mean} | {_hit(row)} | "
                     f"{row['output_tok_s']:.1f} | {_two(row['ttft_ms'])} | {_two(row['e2e_ms'])} | "
                     f"{row['span_s']:.2f} |")
    lines += ["", f"Wall time of the replay: {report['wall_s']:.2f} s; client CPU {100 * report['client_cpu']:.0f}%."]
    all_ = report["overall"]
    notes = []
    if all_["ok"] and all_["cache_reported"] == 0:
        notes.append("- prompt cache hit n/a: the server's usage carries no prompt_tokens_details.cached_tokens")
    notes += [f"- turn {r['turn']}: cached tokens reported for {r['cache_reported']} of {r['ok']} answers; the hit "
              "rate is over those" for r in report["turns"] if 0 < r["cache_reported"] < r["ok"]]
    notes += [f"- turn {r['turn']}: {r['finished_early']} of {r['ok']} answers ended before max_tokens (the server "
              "ignored ignore_eos)" for r in report["turns"] if r["finished_early"]]
    notes += [f"- turn {r['turn']}: {r['errors']} errors, e.g. {r['error_samples'][0]}"
              for r in report["turns"] if r["errors"]]
    if report["not_sent"]:
        deadline = report["config"].get("deadline_s")  # (older reports: none)
        why = f"the replay's deadline of {deadline:g} s passed, or " if deadline else ""
        notes.append(f"- {report['not_sent']} turns not sent: {why}a failed turn ends its conversation")
    if all_["ok"] and all_["usage_reported"] < all_["ok"]:
        notes.append("- token counts from counted chunks for answers without usage (the server sent none)")
    if report["client_cpu"] > CLIENT_BUSY:
        notes.append(f"- the client was busy {100 * report['client_cpu']:.0f}% of the time; it may have set the pace")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def write_report(report: MultiTurnReport, out_dir: Path) -> list[Path]:
    """``bench.json`` and ``bench.md`` in ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / "bench.json", out_dir / "bench.md"
    js.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    md.write_text(markdown(report), encoding="utf-8")
    return [js, md]


def load_report(path: Path) -> MultiTurnReport:
    """Read a multi-turn ``bench.json``; raises ``ValueError`` naming the file and what is wrong with it."""
    data = read_report(path, MULTITURN_SCHEMA)
    turns = data.get("turns")
    if not isinstance(turns, list) or not all(isinstance(t, dict) and "turn" in t for t in turns) \
            or not isinstance(data.get("overall"), dict):
        raise ValueError(f"{path}: fields 'turns' (a list of turns with a 'turn') and 'overall' are required")
    return cast(MultiTurnReport, data)


# (metric path, name in the table, True when higher is better)
COMPARED = (
    ("ttft_ms.p50", "TTFT p50 ms", False),
    ("ttft_ms.p99", "TTFT p99 ms", False),
    ("cache_hit", "prompt cache hit", True),
    ("output_tok_s", "output tok/s", True),
    ("e2e_ms.p50", "E2E p50 ms", False),
    ("span_s", "span s", False),
)


def compare_markdown(reports: Sequence[MultiTurnReport]) -> str:
    """Each turn of the first replay, and all turns, against the same of the others: values and ratios."""
    runs = [f"- **{r['label']}**: {describe(r)} ({r['created_utc']})" for r in reports]
    lines = compare_head([r["label"] for r in reports], "turn", runs)
    for row in [*reports[0]["turns"], reports[0]["overall"]]:
        matches = [next((o for o in [*r["turns"], r["overall"]] if o["turn"] == row["turn"]), None)
                   for r in reports[1:]]
        lines += compare_rows(str(row["turn"]), row, matches, COMPARED)
    return "\n".join(lines) + "\n" + "\nspan s of turn all: the replay's wall time.\n" + COMPARE_FOOT
