"""``llamafleet consistency``: do batching, replicas, ``n_batch`` and GPU splits change the model's answers?

Runs one prompt set greedily through a reference (one sequence at a time) and the chosen configurations, compares
each with the reference token by token and by log-probability, prints a markdown report and, with ``--out DIR``,
writes ``consistency.json`` and ``consistency.md`` there. Exit code: 0 every configuration passed (or was
skipped), 1 one failed or could not run, 2 the command itself was given something unusable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from llamafleet.bench.loadgen import BenchError
from llamafleet.config import ConfigError, load_config
from llamafleet.consistency.compare import CPU_THRESHOLDS, GPU_THRESHOLDS, Thresholds
from llamafleet.consistency.prompts import builtin_prompts, load_prompts
from llamafleet.consistency.report import to_json, to_markdown
from llamafleet.consistency.run import (
    DEFAULT_CONFIGS,
    CheckOptions,
    ConfigNameError,
    parse_configs,
    run_check,
    usable_inventory,
)
from llamafleet.model.demo import ModelFetchError, default_model_path
from llamafleet.model.header import GgufError, read_model_info
from llamafleet.placement.gpus import detect_inventory


def _gpu_build() -> bool:
    from llamafleet.engine.llama import supports_gpu_offload  # loads llama.cpp: only asked when GPUs are present

    return supports_gpu_offload()


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {"model_path": args.model, "context_length": args.ctx, "batch_size": args.n_batch,
            "threads": args.threads, "log_level": args.log_level}


def run(args: argparse.Namespace) -> int:
    try:
        fleet = load_config(args.config, _overrides(args))
        configs = parse_configs(args.configs)
        prompts = load_prompts(args.prompts) if args.prompts else builtin_prompts()
        model_path = Path(fleet.model_path) if fleet.model_path else default_model_path()
        model = read_model_info(model_path)
        opts = CheckOptions(fleet, str(model_path), configs, args.max_tokens, args.concurrency)
    except (BenchError, ConfigError, ConfigNameError, GgufError, ModelFetchError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    inventory = usable_inventory(detect_inventory(), _gpu_build)
    base = GPU_THRESHOLDS if inventory.gpus else CPU_THRESHOLDS
    try:
        limits = Thresholds(
            min_exact_match=base.min_exact_match if args.min_exact_match is None else args.min_exact_match,
            min_agreement_mean=base.min_agreement_mean if args.min_agreement is None else args.min_agreement,
            max_abs_dlogprob=base.max_abs_dlogprob if args.max_dlogprob is None else args.max_dlogprob,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = run_check(opts, prompts, model, inventory, limits, lambda line: print(line, file=sys.stderr, flush=True))
    text = to_markdown(report)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "consistency.json").write_text(to_json(report) + "\n", encoding="utf-8")
        (out / "consistency.md").write_text(text, encoding="utf-8")
        print(f"wrote {out / 'consistency.json'} and {out / 'consistency.md'}", file=sys.stderr)
    return 0 if report.passed else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "consistency",
        help="check that batching, replicas, n_batch and GPU splits give the same greedy answers as one sequence",
        description="Run one prompt set greedily through a reference (one sequence at a time) and other "
        "configurations of the same model, each in its own worker processes, and compare every answer with the "
        "reference: exact-match rate, token agreement up to the first divergence, and the chosen tokens' "
        "log-probability differences. Exit code 0 pass, 1 fail, 2 bad input.",
    )
    p.add_argument("--config", metavar="FILE", help="fleet YAML file: model, gpus, split_ratio, kv cache, threads")
    p.add_argument("--model", metavar="PATH", help="GGUF file (default: the config's, else the built-in demo model)")
    p.add_argument("--prompts", metavar="FILE", help="one prompt per line, or a .jsonl file (default: 20 built-in "
                   "business questions, half English, half Chinese)")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), metavar="LIST",
                   help="comma-separated: reference, batched, nbatch-<k>, replica-<i>, layer, tensor; the reference "
                   "always runs; GPU splits are skipped without 2+ GPUs (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=64, metavar="N", help="tokens per answer (default %(default)s)")
    p.add_argument("--concurrency", type=int, default=8, metavar="N",
                   help="sequences decoding together in 'batched' (default %(default)s)")
    p.add_argument("--ctx", type=int, default=1024, metavar="TOKENS", help="context per sequence (default %(default)s)")
    p.add_argument("--n-batch", type=int, default=512, metavar="N",
                   help="n_batch of every configuration except nbatch-<k> (default %(default)s)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads of every worker (default: all cores)")
    p.add_argument("--min-exact-match", type=float, metavar="X",
                   help=f"pass needs an exact-match rate >= X (default {CPU_THRESHOLDS.min_exact_match} on CPU, "
                   f"{GPU_THRESHOLDS.min_exact_match} on GPU)")
    p.add_argument("--min-agreement", type=float, metavar="X",
                   help=f"pass needs a mean token agreement >= X (default {CPU_THRESHOLDS.min_agreement_mean} on CPU, "
                   f"{GPU_THRESHOLDS.min_agreement_mean} on GPU)")
    p.add_argument("--max-dlogprob", type=float, metavar="X",
                   help=f"pass needs max |dlogprob| <= X (default {CPU_THRESHOLDS.max_abs_dlogprob} on CPU, "
                   f"{GPU_THRESHOLDS.max_abs_dlogprob} on GPU)")
    p.add_argument("--out", metavar="DIR", help="also write consistency.json and consistency.md into DIR")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="warning",
                   help="log level of this process and its workers (default %(default)s)")
    p.set_defaults(func=run)
