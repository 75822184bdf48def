"""What prefix reuse saves and what it costs, in-process: prefill of a shared prefix with and without the prefix
cache, and the price of the whole-stream KV copy that sharing a prefix between slots needs.

    python scripts/prefix_probe.py [MODEL.gguf] [--prefix 1000] [--threads N]     (default: the demo model)

Engine lines time one request's first token (prompt = a shared prefix + a short question of its own): computed
from scratch (cache off); reused in place (the same slot ran the prefix before); copied from another slot that is
still running; and a burst of 4 such requests arriving together (cache on: the prefix is prefilled once, then
copied). Copy lines time ``llama_memory_seq_cp`` of one sequence's whole stream into another, which llama.cpp does
at the next ``llama_decode`` (a one-token decode with and without a copy queued before it), for several context
sizes per sequence: the copy moves every cell of the stream, so its cost follows the context size, not the prefix.
The numbers are in docs/BENCHMARKS.md ("Prefix reuse on CPU").
"""

from __future__ import annotations

import argparse
import time

# isort: off
import llamafleet.engine.llama as L  # llama.cpp before numpy, or a CUDA build can crash (see engine/llama.py)
# isort: on

from llamafleet.engine.engine import Engine
from llamafleet.engine.types import EngineConfig, Request, SamplingParams
from llamafleet.model.demo import default_model_path

FIRST = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
QUESTIONS = ["What is a replica?", "How is a slot chosen?", "Why copy the stream?", "What does seq_rm do?"]


def prompts(eng: Engine, n_prefix: int) -> list[tuple[int, ...]]:
    words = " ".join(f"Rule {i}: requests are served in order, and each replica keeps its own cache." for i in
                     range(n_prefix))
    prefix = eng.tokenize(words)[:n_prefix]
    return [tuple(prefix + eng.tokenize(" " + q, add_special=False)) for q in QUESTIONS]


def first_token_s(eng: Engine, reqs: list[Request]) -> float:
    t0 = time.perf_counter()
    eng.generate(reqs)
    return time.perf_counter() - t0


def engine_lines(model: str, n_prefix: int, threads: int | None) -> None:
    base = EngineConfig(model_path=model, n_seq=4, n_ctx_per_seq=2048, n_batch=512, n_threads=threads)
    with Engine(EngineConfig(**{**base.__dict__, "prefix_cache": False})) as cold:
        ps = prompts(cold, n_prefix)
        t_cold = first_token_s(cold, [Request("c", ps[0], FIRST)])
        t_burst_off = first_token_s(cold, [Request(f"b{i}", p, FIRST) for i, p in enumerate(ps)])
    with Engine(base) as warm:
        first_token_s(warm, [Request("w0", ps[0], FIRST)])
        t_here = first_token_s(warm, [Request("w1", ps[1], FIRST)])
        long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
        warm.add_request(Request("run", ps[2], long))  # takes slot 0 (it holds the prefix), then keeps decoding
        while not any(o.request_id == "run" for o in warm.step()):
            pass
        warm.add_request(Request("copy", ps[3], FIRST))
        t0 = time.perf_counter()
        while not any(o.request_id == "copy" and o.finished for o in warm.step()):
            pass
        t_copy = time.perf_counter() - t0
        warm.abort("run")
        while warm.has_work():
            warm.step()
    with Engine(base) as burst:
        t_burst_on = first_token_s(burst, [Request(f"b{i}", p, FIRST) for i, p in enumerate(ps)])
        cached = burst.stats().prompt_tokens_cached_total
    n = len(ps[0])
    print(f"prompt {n} tokens ({n_prefix} shared), first token of one request:")
    print(f"  computed from scratch        {t_cold * 1e3:9.1f} ms")
    print(f"  reused in place              {t_here * 1e3:9.1f} ms")
    print(f"  copied from a running slot   {t_copy * 1e3:9.1f} ms (one decode step of the running one included)")
    print(f"burst of {len(ps)} requests, all first tokens: cache off {t_burst_off * 1e3:.1f} ms, "
          f"cache on {t_burst_on * 1e3:.1f} ms ({cached} prompt tokens from the cache)")


def copy_lines(model: str, threads: int | None, reps: int = 9) -> None:
    for ctx in (1024, 2048, 4096):
        cfg = EngineConfig(model_path=model, n_seq=2, n_ctx_per_seq=ctx, n_batch=512, n_threads=threads)
        with L.Model(cfg) as m, L.Context(m, cfg) as c, L.Batch(512) as b:
            b.token[:256] = 100
            b.pos[:256] = range(256)
            b.seq[:256] = 0
            b.logits[:256] = 0
            b.n_tokens = 256
            c.launch(b)  # sequence 0 holds 256 tokens
            c.wait()

            def one_token(copy: bool, pos: int) -> float:
                c.keep_prefix(1, 0)
                t0 = time.perf_counter()
                if copy:
                    c.copy_sequence(0, 1)
                    c.keep_prefix(1, pos)
                b.token[0], b.pos[0], b.seq[0], b.logits[0] = 100, pos if copy else 0, 1, 1
                b.n_tokens = 1
                assert c.launch(b) == 0
                c.wait()
                return time.perf_counter() - t0

            plain = min(one_token(False, 0) for _ in range(reps))  # min: the machine may be shared
            copied = min(one_token(True, 200) for _ in range(reps))
            print(f"  n_ctx_per_seq {ctx:5d}: 1-token decode {plain * 1e3:7.2f} ms, with a whole-stream copy "
                  f"before it {copied * 1e3:7.2f} ms: the copy costs {(copied - plain) * 1e3:7.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="GGUF file (default: the demo model)")
    ap.add_argument("--prefix", type=int, default=1000, help="tokens of the shared prefix")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    model = args.model or str(default_model_path())
    engine_lines(model, args.prefix, args.threads)
    print("whole-stream KV copy (llama_memory_seq_cp across streams, applied at the next decode):")
    copy_lines(model, args.threads)


if __name__ == "__main__":
    main()
