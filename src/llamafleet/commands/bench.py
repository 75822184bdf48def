"""``llamafleet bench``: measure a server over HTTP, compare runs, or time the engine in-process.

Three forms share one parser:

- ``llamafleet bench [http] --url URL ...``: a concurrency sweep against any OpenAI-compatible endpoint; prints the
  table and writes ``bench.json``, ``bench.md``, ``throughput.png``, ``ttft.png`` (see :mod:`llamafleet.bench.loadgen`);
- ``llamafleet bench --compare A.json B.json ...``: the ratio table between runs (see :mod:`llamafleet.bench.report`);
- ``llamafleet bench engine ...``: the in-process engine benchmark (see :mod:`llamafleet.bench.engine`).

A flag that belongs to another form is refused with its name, rather than silently ignored.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from llamafleet.bench import loadgen
from llamafleet.bench import report as bench_report
from llamafleet.model.demo import ModelFetchError, default_model_path

# Flags that only one form reads (dest -> flag); the shared ones (--model, --requests, --max-tokens) are not here.
HTTP_ONLY = {"url": "--url", "concurrency": "--concurrency", "duration": "--duration",
             "prompt_tokens": "--prompt-tokens", "prompts": "--prompts", "chat": "--chat", "api_key": "--api-key",
             "label": "--label", "timeout": "--timeout", "warmup": "--warmup", "no_progress": "--no-progress",
             "no_ignore_eos": "--no-ignore-eos"}
ENGINE_ONLY = {"threads": "--threads", "json": "--json", "batch": "--batch", "backend_sampling": "--backend-sampling",
               "kv_unified": "--kv-unified", "no_overlap": "--no-overlap"}
SHARED = {"model": "--model", "requests": "--requests", "max_tokens": "--max-tokens"}


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        levels = ()
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 1,8,32, got {text!r}")
    return levels


def _number(kind: type[int] | type[float], allow_zero: bool = False) -> Callable[[str], int | float]:
    """An argparse type: a positive ``kind`` (or non-negative with ``allow_zero``)."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = -1
        if value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(
                f"expected a {'non-negative' if allow_zero else 'positive'} {kind.__name__}, got {text!r}")
        return value
    return parse


def _refuse(args: argparse.Namespace, flags: dict[str, str], form: str, why: str) -> str | None:
    """An error naming every flag of ``flags`` that was given, or ``None``."""
    given = [flag for dest, flag in flags.items() if getattr(args, dest) not in (None, False)]
    if not given:
        return None
    return f"{', '.join(given)} cannot be used with {form} ({why}); remove {'it' if len(given) == 1 else 'them'}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def _run_http(args: argparse.Namespace) -> int:
    if (err := _refuse(args, ENGINE_ONLY, "`llamafleet bench http`", "engine-only")):
        return _fail(err)
    try:
        prompts = loadgen.load_prompts(Path(args.prompts)) if args.prompts else loadgen.PromptSet(
            words=args.prompt_tokens or 128)
        url = args.url or "http://127.0.0.1:8080"
        model = args.model or loadgen.resolve_model(url, args.api_key)
        cfg = loadgen.BenchConfig(url=url, model=model, concurrency=args.concurrency or (1, 8, 32),
                                requests=args.requests, duration=args.duration, max_tokens=args.max_tokens or 128,
                                chat=args.chat, api_key=args.api_key, timeout=args.timeout or 600.0,
                                warmup=1 if args.warmup is None else args.warmup,
                                ignore_eos=not args.no_ignore_eos)
        runs = loadgen.run(cfg, prompts, progress=not args.no_progress)
    except (loadgen.BenchError, ValueError) as e:
        return _fail(str(e))
    label = args.label or model
    report = bench_report.build_report(cfg, prompts, runs, label)
    out = Path(args.out) if args.out else Path("bench-out") / f"{_slug(label)}-{datetime.now():%Y%m%d-%H%M%S}"
    files = bench_report.write_report(report, out)
    print(bench_report.markdown(report))
    print("wrote " + ", ".join(str(f) for f in files))
    failed = sum(lv["errors"] for lv in report["levels"])
    if failed:
        print(f"{failed} requests failed; see error_samples in {files[0]}", file=sys.stderr)
    return 1 if failed else 0


def _run_compare(args: argparse.Namespace) -> int:
    if (err := _refuse(args, HTTP_ONLY | ENGINE_ONLY | SHARED, "--compare", "it reads reports; only --out applies")):
        return _fail(err)
    try:
        reports = bench_report.load_reports([Path(p) for p in args.compare])
        table = bench_report.compare_markdown(reports)
    except ValueError as e:
        return _fail(str(e))
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(table, encoding="utf-8")
        files = [out / "compare.md", *bench_report.write_plots(reports, out)]
        print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _run_engine(args: argparse.Namespace) -> int:
    if (err := _refuse(args, HTTP_ONLY | {"out": "--out"}, "`llamafleet bench engine`", "http-only")):
        return _fail(err)
    from llamafleet.bench import engine as enginebench  # loads llama.cpp: only this form needs it
    from llamafleet.engine.types import EngineConfig

    try:
        model = Path(args.model) if args.model else default_model_path(progress=True)
    except ModelFetchError as e:
        return _fail(str(e))
    if not model.is_file():
        return _fail(f"--model: no GGUF file at {model}")
    n, max_tokens = args.requests or 8, args.max_tokens or 64
    # the built-in prompts are a few dozen tokens; 128 tokens of headroom per sequence holds any of them
    cfg = EngineConfig(model_path=str(model), n_seq=n, n_ctx_per_seq=max_tokens + 128, n_threads=args.threads,
                       n_batch=args.batch or 512, n_ubatch=min(args.batch or 512, 512),
                       backend_sampling=bool(args.backend_sampling), kv_unified=bool(args.kv_unified),
                       overlap=not args.no_overlap)
    result = enginebench.run(cfg, n_requests=n, max_tokens=max_tokens)
    print(enginebench.to_json(result) if args.json else enginebench.markdown(result))
    return 0


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def _run(args: argparse.Namespace) -> int:
    if args.compare:
        if args.mode != "http":
            return _fail("--compare compares bench.json reports of `llamafleet bench http`; drop 'engine'")
        return _run_compare(args)
    return _run_engine(args) if args.mode == "engine" else _run_http(args)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench", help="benchmark a server over HTTP (default), compare runs, or time the engine in-process",
        description="llamafleet bench [http] --url URL ... | llamafleet bench --compare A.json B.json ... | "
                    "llamafleet bench engine [--model FILE] ...",
    )
    p.add_argument("mode", nargs="?", choices=["http", "engine"], default="http",
                   help="http: load-test an OpenAI-compatible endpoint (default); engine: in-process engine bench")
    p.add_argument("--model", help="http: model name to request (default: the first in /v1/models); "
                                   "engine: GGUF file (default: the built-in demo model)")
    count = p.add_mutually_exclusive_group()
    count.add_argument("--requests", type=_number(int), metavar="N", help="http: requests per concurrency level "
                   "(default: 4 x concurrency, at least 16); engine: requests per phase (default 8)")
    p.add_argument("--max-tokens", type=_number(int), metavar="N",
                   help="tokens to generate per request (http 128, engine 64)")

    h = p.add_argument_group("http")
    h.add_argument("--url", help="server base URL (default http://127.0.0.1:8080; a trailing /v1 is fine)")
    h.add_argument("--concurrency", type=_levels, metavar="LIST",
                   help="comma-separated concurrency levels (default 1,8,32)")
    count.add_argument("--duration", type=_number(float), metavar="S",
                       help="http: seconds per level instead of a request count")
    source = h.add_mutually_exclusive_group()
    source.add_argument("--prompt-tokens", type=_number(int), metavar="N",
                        help="synthetic prompts of about N tokens (default 128)")
    source.add_argument("--prompts", metavar="FILE", help="prompt file: .jsonl ({\"prompt\"}, {\"messages\"} or "
                                                     "strings) or text, one prompt per line")
    h.add_argument("--chat", action="store_true", help="use /v1/chat/completions instead of /v1/completions")
    h.add_argument("--api-key", metavar="KEY", help="sent as 'Authorization: Bearer KEY' (never written to the report)")
    h.add_argument("--out", metavar="DIR", help="output folder (default bench-out/LABEL-TIMESTAMP); "
                                                "with --compare: also write compare.md and plots there")
    h.add_argument("--label", help="this run's name in tables and plots (default: the model name)")
    h.add_argument("--timeout", type=_number(float), metavar="S", help="seconds one request may take (default 600)")
    h.add_argument("--warmup", type=_number(int, allow_zero=True), metavar="N",
                   help="untimed requests sent first (default 1)")
    h.add_argument("--no-ignore-eos", action="store_true",
                   help="do not send \"ignore_eos\": true (for servers that refuse unknown fields)")
    h.add_argument("--no-progress", action="store_true", help="no progress bar")
    h.add_argument("--compare", nargs="+", metavar="REPORT", help="print the ratio table of bench.json files, "
                                                                  "each against the first")

    e = p.add_argument_group("engine")
    e.add_argument("--threads", type=_number(int), metavar="N", help="CPU threads (default: all cores)")
    e.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    e.add_argument("--batch", type=_number(int), metavar="N", help="n_batch: tokens per llama_decode (default 512)")
    e.add_argument("--backend-sampling", action="store_true",
                   help="sample greedy requests inside llama.cpp's graph instead of on the host")
    e.add_argument("--kv-unified", action="store_true",
                   help="one KV cache shared by all sequences instead of one stream per sequence")
    e.add_argument("--no-overlap", action="store_true",
                   help="wait for each decode before detokenizing (default: text work overlaps the next decode)")
    p.set_defaults(func=_run)
