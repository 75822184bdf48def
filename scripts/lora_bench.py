"""What a decode step costs the engine when its sequences ask for different LoRA adapters (engine/lora.py).

    python scripts/lora_bench.py [MODEL.gguf] [--seqs 8 32] [--rounds 5] [--steps 8] [--threads N] [--out FILE]

For each number of sequences, ``--seqs`` requests run in one engine (a 64-token prompt each, then answers past
their end of text) five ways: all on the base model; all with one adapter; half base, half with an adapter (two
decodes per step, the base first); half with adapter A, half with B; a quarter each with four adapters. Once every
prompt is prefilled, ``--steps`` decode steps are timed and their median kept; the five ways take turns round by
round (``--rounds``) so that all see the same load. Rank-8 adapters on the query and value projections
(``llamafleet synth --lora-for``), on the demo model by default. Writes the medians, their ratios to the base model's
step, and the adapter switches per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# isort: off
import llamafleet.engine.llama  # noqa: F401  (llama.cpp before numpy, see engine/llama.py)
# isort: on

from llamafleet.engine.engine import Engine
from llamafleet.engine.types import EngineConfig, LoraSpec, Request, SamplingParams
from llamafleet.model.demo import default_model_path
from llamafleet.model.synth_lora import write_lora

PROMPT = tuple(range(100, 164))
# the adapters of each sequence, by its index modulo the pattern's length
WAYS: dict[str, list[tuple[tuple[str, float], ...]]] = {
    "base": [()],
    "one_adapter": [(("a0", 1.0),)],
    "base_and_adapter": [(), (("a0", 1.0),)],
    "two_adapters": [(("a0", 1.0),), (("a1", 1.0),)],
    "four_adapters": [(("a0", 1.0),), (("a1", 1.0),), (("a2", 1.0),), (("a3", 1.0),)],
}


def timed_steps(engine: Engine, n: int, pattern: list[tuple[tuple[str, float], ...]], steps: int, tag: str
                ) -> tuple[float, float]:
    """``n`` requests with adapters as ``pattern`` says; the median of ``steps`` decode steps once all are
    prefilled, and the adapter switches per step."""
    ids = [f"{tag}-{i}" for i in range(n)]
    for i, rid in enumerate(ids):
        params = SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True, lora=pattern[i % len(pattern)])
        engine.add_request(Request(rid, PROMPT, params))
    started: set[str] = set()
    while len(started) < n:
        started |= {o.request_id for o in engine.step() if o.token_ids}
    times = []
    switches = engine.lora.switches
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    per_step = (engine.lora.switches - switches) / steps
    for rid in ids:
        engine.abort(rid)
    while engine.has_work():
        engine.step()
    return statistics.median(times), per_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="a GGUF model (default: the demo model)")
    ap.add_argument("--seqs", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args()
    path = Path(args.model) if args.model else default_model_path()
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        lora = tuple(LoraSpec(f"a{i}", str(write_lora(path, Path(tmp) / f"a{i}.gguf", seed=i))) for i in range(4))
        for n in args.seqs:
            cfg = EngineConfig(str(path), n_seq=n, n_ctx_per_seq=256, n_batch=max(512, n), n_threads=args.threads,
                               overlap=False, prefix_cache=False, lora=lora)
            times: dict[str, list[float]] = {k: [] for k in WAYS}
            switches: dict[str, float] = {}
            with Engine(cfg) as engine:
                for r in range(args.rounds + 1):  # the first round warms up (graphs built, buffers sized)
                    for name, pattern in WAYS.items():
                        t, switches[name] = timed_steps(engine, n, pattern, args.steps, f"{n}-{r}-{name}")
                        if r:
                            times[name].append(t)
                        print(f"{n} sequences, round {r}, {name}: {t * 1000:.1f} ms a step", file=sys.stderr)
            median = {k: statistics.median(v) for k, v in times.items()}
            results[str(n)] = {"median_step_s": median,
                               "ratio_to_base": {k: v / median["base"] for k, v in median.items()},
                               "switches_per_step": switches, "step_s": times}
    out = {"model": path.name, "rounds": args.rounds, "steps": args.steps, "threads": args.threads,
           "seqs": results, "load_average": os.getloadavg()}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
