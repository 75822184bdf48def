"""Statistics, files and comparisons for ``llamafleet bench`` runs.

A run's numbers per concurrency level (all latencies in milliseconds, over successful requests):

- ``output_tok_s``: generated tokens of all requests / the level's wall time (aggregate throughput);
- ``steady_tok_s``: generated tokens per second while *all* of the level's streams were generating (between
  their first and last chunks), i.e. with prompt prefill and the ramp up and down left out; the counterpart of
  llama-batched-bench's S_TG. ``None`` when that state lasted under 10% of the wall time;
- ``client_cpu``: the load generator's CPU time / wall time; near 1.0 the client, not the server, set the pace;
- ``requests_s``: successful requests / wall time;
- ``ttft_ms``: time to the first content chunk; ``e2e_ms``: time to the end of the stream;
- ``itl_ms``: gaps between consecutive content chunks, pooled over all requests;
- ``tpot_ms``: per request, (last chunk - first chunk) / (output tokens - 1): time per token after the first;
- ``stream_tok_s``: per request, 1000 / ``tpot_ms``: a single stream's decode speed (comparable to llama-bench tg);
- each distribution as ``mean``, ``p50``, ``p90``, ``p99`` (linear interpolation, like ``numpy.percentile``).

Files: ``bench.json`` (the report), ``bench.md`` (its table), ``throughput.png`` and ``ttft.png`` (one line per
run label; drawn with matplotlib's object API on its Agg canvas: no display, no pyplot state).
:func:`compare_markdown` lines up several reports level by level with ratios against the first.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict, TypeVar, cast

import numpy as np
from matplotlib.figure import Figure

from llamafleet import __version__
from llamafleet.bench.loadgen import BenchConfig, LevelRun
from llamafleet.bench.prompts import PromptSet
from llamafleet.bench.streaming import RequestResult

SCHEMA = "llamafleet.bench/1"
MULTITURN_SCHEMA = "llamafleet.bench.multiturn/1"  # written by llamafleet.bench.multiturn_report
KINDS = {SCHEMA: "concurrency sweep", MULTITURN_SCHEMA: "multi-turn"}
R = TypeVar("R", bound=Mapping[str, Any])  # a report of either kind
CLIENT_BUSY = 0.8  # above this share of one core, the client may be what limits a level


class Dist(TypedDict):
    mean: float
    p50: float
    p90: float
    p99: float


class Outcome(TypedDict):
    """What a set of requests came to (a level of a sweep, a turn of a multi-turn replay)."""

    requests: int
    ok: int
    errors: int
    error_samples: list[str]
    finished_early: int  # ended before max_tokens (EOS or a stop): the server did not honour ignore_eos
    usage_reported: int  # requests whose token count came from the server's usage, not from counted chunks
    output_tokens: int
    prompt_tokens_mean: float | None
    ttft_ms: Dist | None
    itl_ms: Dist | None
    e2e_ms: Dist | None


class Level(Outcome):
    concurrency: int
    wall_s: float
    output_tok_s: float
    steady_tok_s: float | None
    client_cpu: float
    requests_s: float
    tpot_ms: Dist | None
    stream_tok_s: Dist | None


class RunInfo(TypedDict):
    """What every report starts with: its kind, name, time, version, host and configuration."""

    schema: str
    label: str
    created_utc: str
    llamafleet_version: str
    client_host: str
    config: dict[str, Any]


class Report(RunInfo):
    levels: list[Level]


def run_info(schema: str, label: str, config: dict[str, Any]) -> RunInfo:
    return RunInfo(schema=schema, label=label, created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
                   llamafleet_version=__version__, client_host=platform.node(), config=config)


def dist(values: Sequence[float]) -> Dist | None:
    """Mean and percentiles of ``values``; ``None`` when there are none."""
    if not values:
        return None
    a = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = (float(x) for x in np.percentile(a, [50, 90, 99]))
    return Dist(mean=float(a.mean()), p50=p50, p90=p90, p99=p99)


def steady_rate(results: Sequence[RequestResult], concurrency: int, wall: float) -> float | None:
    """Tokens per second over the stretches of time in which ``concurrency`` requests were all between their
    first and last content chunk; ``None`` if those stretches add up to under 10% of ``wall``."""
    spans = [(r.sent_at + r.chunk_times[0], r.sent_at + r.chunk_times[-1]) for r in results if len(r.chunk_times) > 1]
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    stretches: list[tuple[float, float]] = []
    active = 0
    for i, (t, d) in enumerate(edges):
        active += d
        if active >= concurrency and i + 1 < len(edges) and edges[i + 1][0] > t:
            stretches.append((t, edges[i + 1][0]))
    length = sum(b - a for a, b in stretches)
    if not stretches or length < 0.1 * wall:
        return None
    # every chunk, weighted by its request's tokens per chunk (1 where the server sends one token per chunk)
    times = np.concatenate([r.sent_at + np.asarray(r.chunk_times) for r in results if r.chunk_times])
    weights = np.concatenate([np.full(len(r.chunk_times), r.output_tokens / len(r.chunk_times))
                              for r in results if r.chunk_times])
    order = np.argsort(times)
    times, cum = times[order], np.concatenate([[0.0], np.cumsum(weights[order])])
    tokens = sum(cum[np.searchsorted(times, b, "right")] - cum[np.searchsorted(times, a, "right")]
                 for a, b in stretches)
    return float(tokens / length)


def outcome(results: Sequence[RequestResult], max_tokens: int) -> Outcome:
    """Counts, token totals and latency distributions of ``results`` (the distributions over successful ones)."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    prompt_counts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return Outcome(
        requests=len(results),
        ok=len(ok),
        errors=len(failed),
        error_samples=sorted({r.error or "" for r in failed})[:5],
        finished_early=sum(r.output_tokens < max_tokens for r in ok),
        usage_reported=sum(r.usage_reported for r in ok),
        output_tokens=sum(r.output_tokens for r in ok),
        prompt_tokens_mean=float(np.mean(prompt_counts)) if prompt_counts else None,
        ttft_ms=dist([1000.0 * r.chunk_times[0] for r in ok if r.chunk_times]),
        itl_ms=dist([1000.0 * (b - a) for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)]),
        e2e_ms=dist([1000.0 * r.latency for r in ok]),
    )


def summarize(run: LevelRun, max_tokens: int) -> Level:
    """One level's numbers from its raw request results."""
    ok = [r for r in run.results if r.ok]
    tpot = [1000.0 * (r.chunk_times[-1] - r.chunk_times[0]) / (r.output_tokens - 1) for r in ok
            if r.chunk_times and r.output_tokens > 1 and r.chunk_times[-1] > r.chunk_times[0]]
    base = outcome(run.results, max_tokens)
    wall = run.wall_seconds
    return Level(
        concurrency=run.concurrency,
        **base,
        wall_s=wall,
        output_tok_s=base["output_tokens"] / wall if wall > 0 else 0.0,
        steady_tok_s=steady_rate(ok, run.concurrency, wall),
        client_cpu=run.client_cpu_share,
        requests_s=len(ok) / wall if wall > 0 else 0.0,
        tpot_ms=dist(tpot),
        stream_tok_s=dist([1000.0 / t for t in tpot]),
    )


def build_report(cfg: BenchConfig, prompts: PromptSet, runs: Sequence[LevelRun], label: str) -> Report:
    """The whole run as one JSON-ready report (the API key is never written)."""
    config = {
        "url": cfg.url, "model": cfg.model, "endpoint": "/v1/chat/completions" if cfg.chat else "/v1/completions",
        "concurrency": list(cfg.concurrency), "requests_per_level": cfg.requests, "duration_s": cfg.duration,
        "max_tokens": cfg.max_tokens, "prompts": prompts.describe(), "temperature": 0.0, "ignore_eos": cfg.ignore_eos,
        "warmup": cfg.warmup,
    }
    return Report(**run_info(SCHEMA, label, config), levels=[summarize(r, cfg.max_tokens) for r in runs])


def _ms(d: Dist | None) -> str:
    return "—" if d is None else f"{d['p50']:.1f} / {d['p90']:.1f} / {d['p99']:.1f}"


def markdown(report: Report) -> str:
    """The report's table, one row per concurrency level."""
    cfg = report["config"]
    lines = [
        f"### {report['label']}: {cfg['model']} at {cfg['url']} ({cfg['endpoint']}, max_tokens {cfg['max_tokens']}, "
        f"prompts: {cfg['prompts']})",
        "",
        "| concurrency | requests | errors | req/s | output tok/s | steady tok/s | tok/s per stream p50 "
        "| TTFT ms p50/p90/p99 | ITL ms p50/p90/p99 | E2E ms p50/p90/p99 | client CPU |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lv in report["levels"]:
        stream = "—" if lv["stream_tok_s"] is None else f"{lv['stream_tok_s']['p50']:.1f}"
        steady = "—" if lv.get("steady_tok_s") is None else f"{lv['steady_tok_s']:.1f}"
        lines.append(f"| {lv['concurrency']} | {lv['requests']} | {lv['errors']} | {lv['requests_s']:.2f} | "
                     f"{lv['output_tok_s']:.1f} | {steady} | {stream} | {_ms(lv['ttft_ms'])} | "
                     f"{_ms(lv['itl_ms'])} | {_ms(lv['e2e_ms'])} | {100 * lv.get('client_cpu', 0.0):.0f}% |")
    notes = [f"- concurrency {lv['concurrency']}: {lv['finished_early']} of {lv['ok']} answers ended before "
             "max_tokens (the server ignored ignore_eos); throughput counts the tokens actually generated"
             for lv in report["levels"] if lv["finished_early"]]
    notes += [f"- concurrency {lv['concurrency']}: {lv['errors']} errors, e.g. {lv['error_samples'][0]}"
              for lv in report["levels"] if lv["errors"]]
    notes += [f"- concurrency {lv['concurrency']}: token counts from counted chunks (the server sent no usage)"
              for lv in report["levels"] if lv["ok"] and lv["usage_reported"] < lv["ok"]]
    notes += [f"- concurrency {lv['concurrency']}: the client was busy {100 * lv['client_cpu']:.0f}% of the time; "
              "it may have limited this level (run the client on another machine or fewer levels at once)"
              for lv in report["levels"] if lv.get("client_cpu", 0.0) > CLIENT_BUSY]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _plot(reports: Sequence[Report], value: str, ylabel: str, title: str, path: Path) -> None:
    fig = Figure(figsize=(7, 4.5), layout="tight")  # no pyplot: PNGs render with the Agg canvas, no display
    ax = fig.subplots()
    for rep in reports:
        pts = [(lv["concurrency"], v) for lv in rep["levels"] if (v := _metric(lv, value)) is not None]
        ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=rep["label"])
    levels = sorted({lv["concurrency"] for rep in reports for lv in rep["levels"]})
    if len(levels) > 1 and levels[-1] / levels[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=110)


def write_plots(reports: Sequence[Report], out_dir: Path) -> list[Path]:
    """``throughput.png`` and ``ttft.png`` in ``out_dir``, one line per report."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tp, tt = out_dir / "throughput.png", out_dir / "ttft.png"
    _plot(reports, "output_tok_s", "generated tokens/s (all streams)", "Throughput vs concurrency", tp)
    _plot(reports, "ttft_ms.p50", "time to first token, p50 (ms)", "TTFT vs concurrency", tt)
    return [tp, tt]


def write_report(report: Report, out_dir: Path) -> list[Path]:
    """``bench.json``, ``bench.md`` and the two plots in ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / "bench.json", out_dir / "bench.md"
    js.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    md.write_text(markdown(report), encoding="utf-8")
    return [js, md, *write_plots([report], out_dir)]


def _read_json(path: Path) -> tuple[dict[str, Any], str]:
    """A report file's JSON object and its ``schema``; raises ``ValueError`` naming the file and the problem."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") not in KINDS:
        raise ValueError(f"{path}: not a llamafleet bench report (expected \"schema\": \"{SCHEMA}\" or "
                         f"\"{MULTITURN_SCHEMA}\"); pass the bench.json that `llamafleet bench` wrote")
    return data, str(data["schema"])


def report_schema(path: Path) -> str:
    """Which kind of report ``path`` holds: :data:`SCHEMA` (a concurrency sweep) or :data:`MULTITURN_SCHEMA`."""
    return _read_json(path)[1]


def read_report(path: Path, schema: str) -> dict[str, Any]:
    """Read a report of kind ``schema``; a report of the other kind is refused by name, since --compare lines up
    runs of one kind only."""
    data, found = _read_json(path)
    if found != schema:
        raise ValueError(f"{path}: a {KINDS[found]} report, where a {KINDS[schema]} report was expected; "
                         "--compare lines up reports of one kind")
    return data


def load_report(path: Path) -> Report:
    """Read a concurrency sweep's ``bench.json``; raises ``ValueError`` naming the file and what is wrong with it."""
    data = read_report(path, SCHEMA)
    levels = data.get("levels")
    if not isinstance(levels, list) or not all(isinstance(lv, dict) and "concurrency" in lv for lv in levels):
        raise ValueError(f"{path}: field 'levels' must be a list of levels with a 'concurrency'")
    return cast(Report, data)


def load_reports(paths: Sequence[Path], load: Callable[[Path], R]) -> list[R]:
    """Read several reports with ``load``; a label that repeats gets its folder's name added, so table columns stay
    distinct."""
    reports = [load(p) for p in paths]
    labels = [r["label"] for r in reports]
    for rep, path in zip(reports, paths, strict=True):
        if labels.count(rep["label"]) > 1:
            cast(dict[str, Any], rep)["label"] = f"{rep['label']} ({path.resolve().parent.name})"
    return reports


# (metric path, name in the table, True when higher is better)
COMPARED = (
    ("output_tok_s", "output tok/s", True),
    ("steady_tok_s", "steady tok/s", True),
    ("requests_s", "requests/s", True),
    ("stream_tok_s.p50", "tok/s per stream p50", True),
    ("ttft_ms.p50", "TTFT p50 ms", False),
    ("ttft_ms.p99", "TTFT p99 ms", False),
    ("itl_ms.p50", "ITL p50 ms", False),
    ("e2e_ms.p50", "E2E p50 ms", False),
)


def _metric(row: Mapping[str, object], path: str) -> float | None:
    value: Any = row
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) else None


def ratio(base: float | None, other: float | None) -> float | None:
    """``other / base``, or ``None`` where either is missing or the base is zero."""
    if base is None or other is None or base == 0:
        return None
    return other / base


def _fmt(v: float | None) -> str:
    """Enough digits that the printed ratio can be checked from the printed values (TTFTs can be a few ms)."""
    return "—" if v is None else f"{v:.2f}" if abs(v) >= 10 else f"{v:.3f}"


def compare_head(labels: Sequence[str], key: str, runs: Sequence[str]) -> list[str]:
    """The start of a comparison: one line per run (``runs``), then the table's header for rows keyed by ``key``."""
    if len(labels) < 2:
        raise ValueError("--compare needs at least two bench.json files")
    head = f"| {key} | metric | {labels[0]} |" + "".join(f" {n} | {n} / {labels[0]} |" for n in labels[1:])
    return [*runs, "", head, "|---:|---|---:|" + "---:|---:|" * (len(labels) - 1)]


def compare_rows(key: str, base: Mapping[str, object], others: Sequence[Mapping[str, object] | None],
                 compared: Sequence[tuple[str, str, bool]]) -> list[str]:
    """One row per metric of ``compared``: the base value, then each other's value and its ratio to the base
    (``—`` where a run lacks the row or the metric), and a row of errors."""
    lines = []
    for path, title, higher in compared:
        b = _metric(base, path)
        row = f"| {key} | {title} {'↑' if higher else '↓'} | {_fmt(b)} |"
        for m in others:
            v = None if m is None else _metric(m, path)
            r = ratio(b, v)
            row += f" {_fmt(v)} | {'—' if r is None else f'{r:.2f}x'} |"
        lines.append(row)
    errs = "".join(f" {'—' if m is None else m['errors']} | |" for m in others)
    lines.append(f"| {key} | errors | {base['errors']} |{errs}")
    return lines


COMPARE_FOOT = "\n↑ higher is better, ↓ lower is better; a ratio is that run's value / the first run's value.\n"


def compare_markdown(reports: Sequence[Report]) -> str:
    """Each level of the first report against the same level of the others: values and ratios to the first."""
    runs = [f"- **{r['label']}**: {r['config']['model']} at {r['config']['url']}, {r['config']['endpoint']}, "
            f"max_tokens {r['config']['max_tokens']}, prompts: {r['config']['prompts']} ({r['created_utc']})"
            for r in reports]
    lines = compare_head([r["label"] for r in reports], "concurrency", runs)
    for lv in reports[0]["levels"]:
        c = lv["concurrency"]
        matches = [next((o for o in r["levels"] if o["concurrency"] == c), None) for r in reports[1:]]
        lines += compare_rows(str(c), lv, matches, COMPARED)
    return "\n".join(lines) + "\n" + COMPARE_FOOT
