"""Where a single request's time to first token goes inside the engine: timestamps of each step, one request at a time.

    python scripts/ttft_probe.py MODEL.gguf N_SLOTS [PROMPT_WORDS]

Prints the median time to the first token and of the first two steps (the first schedules and launches the prompt's
prefill; the second waits for it and samples). Compare it with the HTTP TTFT of ``llamafleet bench --concurrency 1``
to see what the API path adds.
"""

# isort: off
import llamafleet.engine.llama  # noqa: F401  (llama.cpp before numpy: see engine/llama.py)

# isort: on
import statistics
import sys
import time

from llamafleet.engine.engine import Engine
from llamafleet.engine.types import EngineConfig, Request, SamplingParams

WORDS = ["time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child"]
RUNS, WARMUP = 25, 5


def main(model: str, n_seq: int, n_words: int = 128) -> None:
    prompt = " ".join(WORDS[i % len(WORDS)] for i in range(n_words))
    cfg = EngineConfig(model_path=model, n_seq=n_seq, n_ctx_per_seq=1024, flash_attn=True, prefix_cache=False)
    with Engine(cfg) as engine:
        ids = tuple(engine.tokenize(prompt))
        rows = []
        for i in range(RUNS):
            engine.add_request(Request(f"r{i}", ids, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)))
            t0, marks, first = time.perf_counter(), [], None
            while engine.has_work():
                outs = engine.step()
                marks.append((time.perf_counter() - t0) * 1000)
                if first is None and any(o.token_ids for o in outs):
                    first = marks[-1]
            rows.append((first or marks[-1], marks[0], marks[1] - marks[0]))
        rows = rows[WARMUP:]
    med = [statistics.median(r[k] for r in rows) for k in range(3)]
    print(f"{n_seq} slots, {len(ids)}-token prompt: first token p50 {med[0]:.2f} ms; first step {med[1]:.2f} ms, "
          f"second step {med[2]:.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *(int(a) for a in sys.argv[3:4]))
