"""Decode ceiling through llamafleet's own bindings, without the engine: 128 sequences, 128 decode steps.

    python scripts/decode_probe.py MODEL.gguf

Each line times one setup of the same loop (llama_decode of 128 tokens, one per sequence, then wait): prompts of
equal or of varying length, next tokens random (like llama-batched-bench) or the argmax of the logits (like a
greedy engine; split over threads as the engine does, or in one thread to see what the threads gain). Next to
llama-batched-bench's S_TG it separates what llama.cpp costs through ctypes from what the engine adds.
gpu-bench.sh runs it in its engine phase.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

# isort: off
import llamafleet.engine.llama as L  # llama.cpp before numpy, or a CUDA build can crash (see engine/llama.py)
import numpy as np
# isort: on

from llamafleet.engine.sampling import argmax_rows
from llamafleet.engine.types import EngineConfig

SEQS = STEPS = 128


def main(model: str) -> None:
    cfg = EngineConfig(model_path=model, n_seq=SEQS, n_ctx_per_seq=256, n_batch=512, n_ubatch=512, flash_attn=True)
    rng = np.random.default_rng(0)
    with L.Model(cfg) as m, L.Context(m, cfg) as c, L.Batch(512) as b:

        def run(name: str, prompt_len: Callable[[int], int], greedy: bool, threaded: bool = True) -> None:
            c.clear_all()
            todo = [(s, p) for s in range(SEQS) for p in range(prompt_len(s))]
            for i in range(0, len(todo), 512):
                part = todo[i:i + 512]
                n = len(part)
                b.token[:n] = rng.integers(0, m.n_vocab, n)
                b.pos[:n] = [p for _, p in part]
                b.seq[:n] = [s for s, _ in part]
                b.logits[:n] = 0
                b.n_tokens = n
                assert c.launch(b) == 0
                c.wait()
            pos = np.array([prompt_len(s) for s in range(SEQS)], dtype=np.int32)
            tok = rng.integers(0, m.n_vocab, SEQS)
            dec = pick = 0.0
            t0 = time.perf_counter()
            for i in range(STEPS):
                b.token[:SEQS], b.pos[:SEQS], b.seq[:SEQS], b.logits[:SEQS] = tok, pos + i, np.arange(SEQS), 1
                b.n_tokens = SEQS
                t1 = time.perf_counter()
                assert c.launch(b) == 0
                c.wait()
                t2 = time.perf_counter()
                if greedy:
                    tok = argmax_rows(c.logits(SEQS)) if threaded else np.argmax(c.logits(SEQS), axis=1)
                dec, pick = dec + t2 - t1, pick + time.perf_counter() - t2
            wall = time.perf_counter() - t0
            print(f"| {name} | {SEQS * STEPS / wall:.1f} | {1e3 * dec / STEPS:.2f} | {1e3 * pick / STEPS:.2f} |",
                  flush=True)

        print("| setup | tok/s | decode ms/step | argmax ms/step |\n|---|---:|---:|---:|")
        run("128-token prompts, random next tokens (llama-batched-bench's S_TG loop)", lambda s: 128, False)
        run("16-token prompts, random next tokens", lambda s: 16, False)
        run("16-token prompts, argmax next tokens", lambda s: 16, True)
        run("10..25-token prompts, argmax next tokens (the engine bench's shape)", lambda s: 10 + s % 16, True)
        run("10..25-token prompts, argmax in one thread", lambda s: 10 + s % 16, True, threaded=False)


if __name__ == "__main__":
    main(sys.argv[1])
