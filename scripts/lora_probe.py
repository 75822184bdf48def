"""What serving several LoRA adapters at once would cost per decode step, through llamafleet's bindings.

    python scripts/lora_probe.py [MODEL.gguf] [--seqs 8] [--rounds 20] [--threads N] [--out FILE]

llama.cpp applies adapters per context, not per sequence, so sequences with different adapter sets cannot share one
``llama_decode``: a step would set each group's adapters and decode that group, one decode per group. This times
one decode step of ``--seqs`` sequences (one new token each, after a 64-token prompt) five ways, interleaved round
by round so that all see the same load: the base model alone; every sequence with one adapter (one decode); two
decodes of half the sequences each, with the same adapter (the cost of splitting the step alone); half with
adapter A and half with B (two decodes, adapters set before each); a quarter each with four adapters (four
decodes). Rank-8 adapters on the query and value projections (``llamafleet synth --lora-for``), on the demo model by
default. Writes the median step time of each and the ratios to the base.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

# isort: off
import llamafleet.engine.llama as L  # llama.cpp before numpy, or a CUDA build can crash (see engine/llama.py)
# isort: on

from llamafleet.engine.llama_lora import LoraAdapter, set_adapters
from llamafleet.engine.types import EngineConfig
from llamafleet.model.demo import default_model_path
from llamafleet.model.synth_lora import write_lora

PROMPT = 64


def step(ctx: L.Context, batch: L.Batch, groups: list[tuple[list[tuple[LoraAdapter, float]], list[int]]],
         pos: int) -> float:
    """One decode step: each group's adapters set, then its sequences' next tokens decoded; the seconds it took."""
    t0 = time.perf_counter()
    for adapters, seqs in groups:
        set_adapters(ctx, adapters)
        for i, s in enumerate(seqs):
            batch.token[i], batch.pos[i], batch.seq[i], batch.logits[i] = 100 + s, pos, s, 1
        batch.n_tokens = len(seqs)
        assert ctx.launch(batch) == 0
        ctx.wait()
        ctx.logits(len(seqs))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="a GGUF model (default: the demo model)")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args()
    path = Path(args.model) if args.model else default_model_path()
    n = args.seqs
    cfg = EngineConfig(str(path), n_seq=n, n_ctx_per_seq=PROMPT + (args.rounds + 2) * 5 + 8, n_batch=PROMPT * n,
                       n_threads=args.threads)
    with tempfile.TemporaryDirectory() as tmp, L.Model(cfg) as model, L.Context(model, cfg) as ctx, \
            L.Batch(PROMPT * n) as batch:
        lora = [LoraAdapter(model, str(write_lora(path, Path(tmp) / f"lora-{i}.gguf", seed=i))) for i in range(4)]
        for s in range(n):  # the prompts, without adapters (their KV is what every variant decodes after)
            for i in range(PROMPT):
                batch.token[s * PROMPT + i], batch.pos[s * PROMPT + i], batch.seq[s * PROMPT + i] = 100 + i, i, s
                batch.logits[s * PROMPT + i] = 0
        batch.n_tokens = PROMPT * n
        assert ctx.launch(batch) == 0
        ctx.wait()
        seqs = list(range(n))
        variants = {
            "base": [([], seqs)],
            "one_adapter": [([(lora[0], 1.0)], seqs)],
            "two_decodes_one_adapter": [([(lora[0], 1.0)], seqs[k::2]) for k in range(2)],
            "two_adapters": [([(lora[k], 1.0)], seqs[k::2]) for k in range(2)],
            "four_adapters": [([(lora[k], 1.0)], seqs[k::4]) for k in range(4)],
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        pos = PROMPT
        for r in range(args.rounds + 2):  # the first two rounds warm up (graphs built, buffers sized)
            for name, groups in variants.items():
                t = step(ctx, batch, groups, pos)
                if r >= 2:
                    times[name].append(t)
                pos += 1
        set_adapters(ctx, [])
        for a in lora:
            a.close()
    median = {k: statistics.median(v) for k, v in times.items()}
    result = {"model": path.name, "seqs": n, "rounds": args.rounds, "threads": args.threads,
              "median_step_s": median, "ratio_to_base": {k: v / median["base"] for k, v in median.items()},
              "step_s": times, "load_average": os.getloadavg()}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
