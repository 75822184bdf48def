"""``llamafleet bench``: measure a server over HTTP, compare runs, or time the engine in-process.

Four forms:

- ``llamafleet bench [http] --url URL ...``: a concurrency sweep against any OpenAI-compatible endpoint; prints the
  table and writes ``bench.json``, ``bench.md``, ``throughput.png``, ``ttft.png`` (see :mod:`llamafleet.bench.loadgen`);
- ``llamafleet bench multiturn --url URL ...``: conversations that re-send their history, to measure prefix reuse;
  prints per-turn rows and writes ``bench.json`` and ``bench.md`` (see :mod:`llamafleet.bench.multiturn`);
- ``llamafleet bench --compare A.json B.json ...``: the ratio table between runs of one kind (see
  :mod:`llamafleet.bench.report`);
- ``llamafleet bench engine ...``: the in-process engine benchmark (see :mod:`llamafleet.bench.engine`), a
  sub-parser of its own, so its ``--help`` lists only what applies to it.

``--model`` is a GGUF file here as in every other command (``bench engine --model FILE``); the HTTP form names the
served model with ``--model-name``, and still takes ``--model NAME`` the way it used to, with a note. Flags of the
server and the answers (``--url``, ``--max-tokens``, ``--chat``, ``--out`` ...) may come before or after ``http`` or
``multiturn``. The load generator (httpx), the report (matplotlib) and the engine (llama.cpp) load only when their
form runs.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamafleet.bench.workloads import WORKLOADS
from llamafleet.config import ConfigError, FleetConfig, load_config
from llamafleet.flags import add_flags, overrides

if TYPE_CHECKING:
    from llamafleet.engine.types import EngineConfig

# The HTTP form's flags (dest -> flag), refused with --compare (which only reads reports) and before `engine`;
# SWEEP_FLAGS are those of a concurrency sweep only, refused before `multiturn`.
SWEEP_FLAGS = {"requests": "--requests", "duration": "--duration", "prompt_tokens": "--prompt-tokens",
               "prompts": "--prompts", "workload": "--workload"}
HTTP_FLAGS = {"url": "--url", "model_name": "--model-name", "model_alias": "--model", "max_tokens": "--max-tokens",
              "concurrency": "--concurrency", "chat": "--chat", "api_key": "--api-key", "label": "--label",
              "timeout": "--timeout", "warmup": "--warmup", "no_progress": "--no-progress",
              "no_ignore_eos": "--no-ignore-eos"} | SWEEP_FLAGS


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
    given = [flag for dest, flag in flags.items() if getattr(args, dest, None) not in (None, False)]
    if not given:
        return None
    return f"{', '.join(given)} cannot be used with {form} ({why}); remove {'it' if len(given) == 1 else 'them'}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def served_model_name(args: argparse.Namespace) -> str | None:
    """``--model-name``, or the older ``--model NAME`` of this form (with a note); a GGUF file there is refused."""
    name: str | None = args.model_name
    alias: str | None = args.model_alias
    if alias is None:
        return name
    if name is not None:
        raise ValueError("--model and --model-name both name the served model; keep --model-name")
    if alias.endswith(".gguf") or Path(alias).is_file():
        raise ValueError(f"--model {alias} looks like a GGUF file, but `llamafleet bench` measures a "
                         "server that is already running: pass the name it serves as --model-name, or time the file "
                         "in-process with `llamafleet bench engine --model FILE`")
    print(f"note: `llamafleet bench --model NAME` is now --model-name {alias} (--model is a GGUF file in the other "
          "commands)", file=sys.stderr)
    return alias


def _target(args: argparse.Namespace, max_tokens: int) -> dict[str, Any]:
    """The server and answer settings every HTTP workload takes (keyword arguments of its config); asks the
    server for its model when --model-name is not given."""
    from llamafleet.bench.streaming import resolve_model

    url = args.url or "http://127.0.0.1:8080"
    return {"url": url, "model": served_model_name(args) or resolve_model(url, args.api_key),
            "max_tokens": args.max_tokens or max_tokens, "chat": args.chat, "api_key": args.api_key,
            "timeout": args.timeout or 600.0, "warmup": 1 if args.warmup is None else args.warmup,
            "ignore_eos": not args.no_ignore_eos}


def _out_dir(args: argparse.Namespace, label: str) -> Path:
    return Path(args.out) if args.out else Path("bench-out") / f"{_slug(label)}-{datetime.now():%Y%m%d-%H%M%S}"


def _finish(table: str, files: list[Path], failed: int) -> int:
    print(table)
    print("wrote " + ", ".join(str(f) for f in files))
    if failed:
        print(f"{failed} requests failed; see error_samples in {files[0]}", file=sys.stderr)
    return 1 if failed else 0


def _run_http(args: argparse.Namespace) -> int:
    from llamafleet.bench import loadgen
    from llamafleet.bench import report as bench_report
    from llamafleet.bench.prompts import PromptSet, load_prompts
    from llamafleet.bench.streaming import BenchError
    from llamafleet.bench.workloads import workload_prompts

    try:
        prompts = (load_prompts(Path(args.prompts)) if args.prompts else
                   workload_prompts(args.workload) if args.workload else
                   PromptSet(words=args.prompt_tokens or 128))
        cfg = loadgen.BenchConfig(**_target(args, 128), concurrency=args.concurrency or (1, 8, 32),
                                  requests=args.requests, duration=args.duration)
        runs = loadgen.run(cfg, prompts, progress=not args.no_progress)
    except (BenchError, ValueError) as e:
        return _fail(str(e))
    report = bench_report.build_report(cfg, prompts, runs, args.label or cfg.model)
    files = bench_report.write_report(report, _out_dir(args, report["label"]))
    return _finish(bench_report.markdown(report), files, sum(lv["errors"] for lv in report["levels"]))


def run_multiturn(args: argparse.Namespace) -> int:
    """``llamafleet bench multiturn``."""
    if (err := _refuse(args, SWEEP_FLAGS | {"compare": "--compare"}, "`llamafleet bench multiturn`",
                       "they were given before 'multiturn' and belong to the concurrency sweep")):
        return _fail(err)
    if args.concurrency is not None and len(args.concurrency) > 1:
        return _fail(f"--concurrency: `llamafleet bench multiturn` runs one level (conversations at once), got "
                     f"{','.join(map(str, args.concurrency))}; run it once per level")
    from llamafleet.bench import multiturn
    from llamafleet.bench import multiturn_report as mt_report
    from llamafleet.bench.streaming import BenchError

    try:
        cfg = multiturn.MultiTurnConfig(
            **_target(args, 48), conversations=args.conversations, turns=args.turns,
            system_tokens=args.system_tokens, user_tokens=args.user_tokens, private_tokens=args.private_tokens,
            by_turn=args.by_turn, deadline_s=args.deadline,
            concurrency=args.concurrency[0] if args.concurrency else None,
            seed=multiturn.new_seed() if args.seed is None else args.seed)
        result = multiturn.run(cfg, progress=not args.no_progress)
    except (BenchError, ValueError) as e:
        return _fail(str(e))
    report = mt_report.build_report(cfg, result, args.label or cfg.model)
    files = mt_report.write_report(report, _out_dir(args, report["label"]))
    return _finish(mt_report.markdown(report), files, report["overall"]["errors"])


def _run_compare(args: argparse.Namespace) -> int:
    from llamafleet.bench import report as bench_report

    if (err := _refuse(args, HTTP_FLAGS, "--compare", "it reads reports; only --out applies")):
        return _fail(err)
    paths = [Path(p) for p in args.compare]
    sweeps: list[bench_report.Report] = []  # plots are drawn for sweeps only
    try:
        if bench_report.report_schema(paths[0]) == bench_report.MULTITURN_SCHEMA:
            from llamafleet.bench import multiturn_report as mt_report

            table = mt_report.compare_markdown(bench_report.load_reports(paths, mt_report.load_report))
        else:
            sweeps = bench_report.load_reports(paths, bench_report.load_report)
            table = bench_report.compare_markdown(sweeps)
    except ValueError as e:
        return _fail(str(e))
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(table, encoding="utf-8")
        files = [out / "compare.md", *(bench_report.write_plots(sweeps, out) if sweeps else [])]
        print("wrote " + ", ".join(str(f) for f in files))
    return 0


def run(args: argparse.Namespace) -> int:
    """The HTTP form, or --compare."""
    return _run_compare(args) if args.compare else _run_http(args)


def engine_settings(cfg: FleetConfig, model_path: str, n: int, max_tokens: int, kv_unified: bool = False,
                    overlap: bool = True, room: int = 128, **decided: Any) -> EngineConfig:
    """``bench engine``'s engine: ``serve``'s settings for ``cfg`` (one mapping, :func:`engine_config`), with ``n``
    slots of context enough for ``max_tokens`` after a prompt of up to ``room`` tokens (a built-in question is a few
    dozen; a workload's prompt a few hundred), in llama.cpp's steps of 256 as the planner sizes a server's (else
    llama.cpp warns that the context does not divide evenly between the sequences); ``decided``: further settings of
    the caller's."""
    from llamafleet.placement.memory import pad_ctx
    from llamafleet.placement.planner import engine_config

    return engine_config(cfg, model_path, n_seq=n, n_ctx_per_seq=pad_ctx(max_tokens + room), kv_unified=kv_unified,
                         overlap=overlap, **decided)


def run_engine(args: argparse.Namespace) -> int:
    """``llamafleet bench engine``."""
    before = {k: v for k, v in HTTP_FLAGS.items() if k not in ("requests", "max_tokens", "workload")}  # its own
    if (err := _refuse(args, before | {"out": "--out", "compare": "--compare"}, "`llamafleet bench engine`",
                       "they were given before 'engine' and belong to the HTTP form")):
        return _fail(err)
    from llamafleet.bench import engine as enginebench  # loads llama.cpp: only this form needs it
    from llamafleet.engine.speculative.settings import SpeculativeConfig
    from llamafleet.model.demo import ModelFetchError, default_model_path

    try:
        cfg = load_config(None, overrides(args))
        model = Path(cfg.model_path) if cfg.model_path else default_model_path(progress=True)
    except (ConfigError, ModelFetchError) as e:
        return _fail(str(e))
    if not model.exists():
        return _fail(f"--model: no GGUF file or checkpoint folder at {model}")
    try:
        spec = SpeculativeConfig(mode=args.spec_mode, max_draft=args.max_draft, max_batch=args.spec_max_batch,
                                 draft_model=args.draft_model, draft_cost=args.draft_cost)
    except ValueError as e:
        return _fail(str(e).replace("speculative.max_draft", "--max-draft").replace("speculative.max_batch",
                                                                                   "--spec-max-batch")
                     .replace("speculative.draft_model", "--draft-model").replace("speculative.draft_cost",
                                                                                "--draft-cost"))
    if args.draft_model is not None and not Path(args.draft_model).is_file():
        return _fail(f"--draft-model: no GGUF file at {args.draft_model}")
    engine_cfg = engine_settings(cfg, str(model), args.requests, args.max_tokens, kv_unified=bool(args.kv_unified),
                                 overlap=not args.no_overlap, room=128 if args.workload is None else 1024,
                                 speculative=spec)
    result = enginebench.run(engine_cfg, n_requests=args.requests, max_tokens=args.max_tokens,
                             workload=args.workload, repeat=args.repeat)
    print(enginebench.to_json(result) if args.json else enginebench.markdown(result))
    return 0


def _add_server_flags(p: argparse.ArgumentParser, max_tokens: int) -> None:
    """The flags of the server and the answers, which every HTTP workload takes."""
    p.add_argument("--url", help="server base URL (default http://127.0.0.1:8080; a trailing /v1 is fine)")
    p.add_argument("--model-name", metavar="NAME",
                   help="served model name sent in every request (default: the first in /v1/models)")
    p.add_argument("--model", dest="model_alias", help=argparse.SUPPRESS)  # the older spelling of --model-name
    p.add_argument("--max-tokens", type=_number(int), metavar="N",
                   help=f"tokens to generate per request (default {max_tokens})")
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions instead of /v1/completions")
    p.add_argument("--api-key", metavar="KEY", help="sent as 'Authorization: Bearer KEY' (never written to the report)")
    p.add_argument("--label", help="this run's name in tables and plots (default: the model name)")
    p.add_argument("--timeout", type=_number(float), metavar="S", help="seconds one request may take (default 600)")
    p.add_argument("--warmup", type=_number(int, allow_zero=True), metavar="N",
                   help="untimed requests sent first (default 1)")
    p.add_argument("--no-ignore-eos", action="store_true",
                   help="do not send \"ignore_eos\": true (for servers that refuse unknown fields)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_http_flags(p: argparse.ArgumentParser) -> None:
    _add_server_flags(p, max_tokens=128)
    count = p.add_mutually_exclusive_group()
    count.add_argument("--requests", type=_number(int), metavar="N",
                       help="requests per concurrency level (default: 4 x concurrency, at least 16)")
    count.add_argument("--duration", type=_number(float), metavar="S", help="seconds per level instead of a count")
    p.add_argument("--concurrency", type=_levels, metavar="LIST",
                   help="comma-separated concurrency levels (default 1,8,32)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt-tokens", type=_number(int), metavar="N",
                        help="synthetic prompts of about N tokens (default 128)")
    source.add_argument("--prompts", metavar="FILE", help="prompt file: .jsonl ({\"prompt\"}, {\"messages\"} or "
                                                     "strings) or text, one prompt per line")
    source.add_argument("--workload", choices=WORKLOADS, help="built-in prompts: random (as --prompt-tokens), edit "
                        "(rewrite a given text), extract (copy a paragraph of a long document): where speculative "
                        "decoding can pay, and where it cannot")
    p.add_argument("--out", metavar="DIR", help="output folder (default bench-out/LABEL-TIMESTAMP); "
                                                "with --compare: also write compare.md (and, for sweeps, plots) there")
    p.add_argument("--compare", nargs="+", metavar="REPORT", help="print the ratio table of bench.json files, "
                                                                  "each against the first")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", help="benchmark a server over HTTP (default), replay multi-turn conversations, compare runs, or time "
                      "the engine in-process",
        description="llamafleet bench [http] --url URL ... | llamafleet bench multiturn --url URL ... (see "
                    "`llamafleet bench multiturn --help`) | llamafleet bench --compare A.json B.json ... | "
                    "llamafleet bench engine [--model FILE] ... (see `llamafleet bench engine --help`)",
    )
    _add_http_flags(p)
    forms = p.add_subparsers(dest="form", title="forms", metavar="{http,multiturn,engine}")
    # `bench http ...` is `bench ...`: SUPPRESS keeps flags given before 'http' from being reset by its defaults
    _add_http_flags(forms.add_parser(
        "http", argument_default=argparse.SUPPRESS, help="load-test an OpenAI-compatible endpoint (the default form)",
        description="Load-test an OpenAI-compatible endpoint; `llamafleet bench http ...` is `llamafleet bench ...`."))
    m = forms.add_parser(
        "multiturn", argument_default=argparse.SUPPRESS,
        help="replay conversations that re-send their history: TTFT per turn and the prompt-cache hit rate",
        description="N conversations x T turns sharing one system prompt: every turn re-sends the conversation so "
                    "far, with the server's own answers, plus a new user line. Reports TTFT p50/p99, throughput and "
                    "the prompt-cache hit rate per turn and overall. --turns 1 is the shared-prefix case: many users, "
                    "one long system prompt.")
    _add_server_flags(m, max_tokens=48)
    m.add_argument("--conversations", type=_number(int), default=32, metavar="N",
                   help="conversations (users) (default %(default)s)")
    m.add_argument("--turns", type=_number(int), default=4, metavar="T",
                   help="turns per conversation (default %(default)s; 1: one request per user)")
    m.add_argument("--system-tokens", type=_number(int, allow_zero=True), default=1300, metavar="S",
                   help="one-token words in the system prompt all conversations share (default %(default)s)")
    m.add_argument("--user-tokens", type=_number(int), default=25, metavar="U",
                   help="one-token words in each turn's user line (default %(default)s)")
    m.add_argument("--private-tokens", type=_number(int, allow_zero=True), default=0, metavar="P",
                   help="one-token words of a context of each conversation's own, after the shared system prompt "
                        "(default %(default)s); with more conversations than slots, later turns find their KV "
                        "only in a cache beyond the slots")
    m.add_argument("--concurrency", type=_levels, metavar="N",
                   help="conversations running at once (default: all of them; fewer than the conversations and "
                        "more conversations than slots: sessions outnumber slots)")
    m.add_argument("--by-turn", action="store_true", default=False,
                   help="send every conversation's turn t (--concurrency at a time) before any turn t+1, as agents "
                        "taking turns do (default: each worker runs one conversation's turns back to back)")
    m.add_argument("--deadline", type=_number(float), default=None, metavar="SECONDS",
                   help="send no turn after SECONDS of replay (those in flight finish; the rest are reported as not "
                        "sent), so a replay against a slow server fits a bounded run (default: none)")
    m.add_argument("--seed", type=_number(int, allow_zero=True), default=None, metavar="N",
                   help="seed of the synthetic texts (default: a fresh one, written to the report)")
    m.add_argument("--out", metavar="DIR", help="output folder (default bench-out/LABEL-TIMESTAMP)")
    m.set_defaults(func=run_multiturn)
    e = forms.add_parser(
        "engine", help="time the engine in-process on a GGUF file: sequential vs concurrent requests",
        description="Load a GGUF model in this process and time N greedy requests one after another, then the same "
                    "N at once, through llamafleet's engine (no HTTP).")
    add_flags(e, "bench engine")
    e.add_argument("--requests", type=_number(int), default=8, metavar="N",
                   help="requests per phase (default %(default)s)")
    e.add_argument("--max-tokens", type=_number(int), default=64, metavar="N",
                   help="tokens to generate per request (default %(default)s)")
    e.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    e.add_argument("--workload", choices=WORKLOADS, help="the prompts: random (one-token words), edit (rewrite a "
                   "text), extract (copy a paragraph of a long document) (default: short questions)")
    e.add_argument("--speculative", dest="spec_mode", choices=("off", "ngram", "draft"), default="off",
                   help="speculative decoding: ngram (prompt lookup) or draft (a draft model) runs each phase with "
                        "and without it, side by side (default %(default)s)")
    e.add_argument("--draft-model", metavar="PATH",
                   help="with --speculative draft: the draft model's GGUF (the model's vocabulary)")
    e.add_argument("--draft-cost", type=_number(float, allow_zero=True), metavar="X",
                   help="with --speculative: a drafted token's cost as a share of a step, fixed (0: draft whenever "
                        "a draft is found); default: measured")
    e.add_argument("--max-draft", type=_number(int), default=8, metavar="N",
                   help="with --speculative: most tokens drafted per sequence per step (default %(default)s)")
    e.add_argument("--repeat", type=_number(int), default=1, metavar="N",
                   help="with --speculative: run each pair of phases N times in turn, off first in odd pairs and on "
                        "first in even ones; the ratio is the pairs' median (default %(default)s)")
    e.add_argument("--spec-max-batch", type=_number(int), default=4, metavar="N",
                   help="with --speculative: speculate only while at most N sequences decode (default %(default)s)")
    e.add_argument("--kv-unified", action="store_true",
                   help="one KV cache shared by all sequences instead of one stream per sequence")
    e.add_argument("--no-overlap", action="store_true",
                   help="wait for each decode before detokenizing (default: text work overlaps the next decode)")
    e.set_defaults(func=run_engine)
    p.set_defaults(func=run)
