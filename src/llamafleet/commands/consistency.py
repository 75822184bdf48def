"""``llamafleet consistency``: do batching, replicas, ``n_batch`` and GPU splits change the model's answers?

Runs one prompt set greedily through a reference (one sequence at a time) and the chosen configurations, compares
each with the reference token by token and by log-probability, prints a markdown report and, with ``--out DIR``,
writes ``consistency.json`` and ``consistency.md`` there. Exit code: 0 every configuration passed (or was
skipped), 1 one failed or could not run, 2 the command itself was given something unusable.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from llamafleet.config import ConfigError, load_config
from llamafleet.consistency.compare import CPU_THRESHOLDS, GPU_THRESHOLDS, Thresholds
from llamafleet.exits import Exit
from llamafleet.flags import add_config_flag, add_flags, overrides

if TYPE_CHECKING:
    from llamafleet.consistency.run import CheckOptions

# What runs without --configs: consistency.run.DEFAULT_CONFIGS, written out because importing that module loads the
# fleet and the planner, which building the parser must not (a unit test keeps the two equal).
DEFAULT_CONFIGS = "reference,batched,nbatch-16,replica-0,replica-1,layer,tensor"


def _gpu_build() -> bool:
    # loads llama.cpp: only asked when GPUs are present
    from llamafleet.engine.llama_backend import supports_gpu_offload

    return supports_gpu_offload()


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="llamafleet-convert-") as tmp:  # gguf's converted file, if any
        return _run(args, Path(tmp))


def _run(args: argparse.Namespace, tmp: Path) -> int:
    # the fleet, the planner and the prompt loader load here, not when the parser is built for another command
    from llamafleet.consistency.prompts import builtin_prompts, load_prompts
    from llamafleet.consistency.report import to_json, to_markdown
    from llamafleet.consistency.run import CheckOptions, ConfigNameError, parse_configs, run_check, usable_inventory
    from llamafleet.model.checkpoint import describe, is_checkpoint
    from llamafleet.model.demo import ModelFetchError, default_model_path
    from llamafleet.model.header import GgufError
    from llamafleet.model.synth import SynthError
    from llamafleet.placement.gpus import detect_inventory

    try:
        fleet = load_config(args.config, overrides(args))
        configs = parse_configs(args.configs)
        prompts = load_prompts(args.prompts) if args.prompts else builtin_prompts()
        model_path = Path(fleet.model_path) if fleet.model_path else default_model_path()
        model = describe(model_path)
        opts = CheckOptions(fleet, str(model_path), configs, args.max_tokens, args.concurrency)
        if "gguf" in configs and is_checkpoint(model_path):
            opts = _converted(model_path, tmp, args.vocab, opts)
    except (GgufError, ModelFetchError, SynthError) as e:
        print(f"error: {e}", file=sys.stderr)
        return Exit.MODEL
    except (ConfigError, ConfigNameError, ValueError) as e:  # PromptFileError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return Exit.USAGE
    logging.getLogger().setLevel(fleet.log_level.upper())
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
        return Exit.USAGE
    report = run_check(opts, prompts, model, inventory, limits, lambda line: print(line, file=sys.stderr, flush=True))
    text = to_markdown(report)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "consistency.json").write_text(to_json(report) + "\n", encoding="utf-8")
        (out / "consistency.md").write_text(text, encoding="utf-8")
        print(f"wrote {out / 'consistency.json'} and {out / 'consistency.md'}", file=sys.stderr)
    return Exit.OK if report.passed else Exit.NO


def _converted(folder: Path, tmp: Path, vocab: str | None, opts: CheckOptions) -> CheckOptions:
    """``opts`` with ``gguf``: the checkpoint ``folder`` converted to an F16 GGUF in ``tmp`` (its tokenizer from the
    vocab GGUF ``vocab``, LLaMA-2's by default)."""
    from llamafleet.model.convert_hf import checkpoint_to_gguf
    from llamafleet.model.synth import find_vocab

    print(f"converting {folder} to an F16 GGUF for the gguf configuration", file=sys.stderr)
    return dataclasses.replace(opts, gguf=str(checkpoint_to_gguf(folder, tmp / f"{folder.name}.f16.gguf",
                                                                 find_vocab(vocab))))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "consistency",
        help="check that batching, replicas, n_batch and GPU splits give the same greedy answers as one sequence",
        description="Run one prompt set greedily through a reference (one sequence at a time) and other "
        "configurations of the same model, each in its own worker processes, and compare every answer with the "
        "reference: exact-match rate, token agreement up to the first divergence, and the chosen tokens' "
        "log-probability differences. Flags override the --config file; --batch is the n_batch of every "
        "configuration except nbatch-<k>. Exit code 0 pass, 1 fail, 2 bad input.",
    )
    add_config_flag(p)
    add_flags(p, "consistency")
    p.add_argument("--prompts", metavar="FILE", help="one prompt per line, or a .jsonl file (default: 20 built-in "
                   "business questions, half English, half Chinese)")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, metavar="LIST",
                   help="comma-separated: reference, batched, nbatch-<k>, replica-<i>, layer, tensor, gguf (a "
                   "checkpoint folder's weights as an F16 GGUF on llama.cpp, against the torch engine); the "
                   "reference always runs; GPU splits are skipped without 2+ GPUs (default: %(default)s)")
    p.add_argument("--vocab", metavar="PATH|NAME", help="with gguf: the vocab GGUF of the checkpoint's tokenizer "
                   "(as for synth; default LLaMA-2's)")
    p.add_argument("--max-tokens", type=int, default=64, metavar="N", help="tokens per answer (default %(default)s)")
    p.add_argument("--concurrency", type=int, default=8, metavar="N",
                   help="sequences decoding together in 'batched' (default %(default)s)")
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
    p.set_defaults(func=run)
