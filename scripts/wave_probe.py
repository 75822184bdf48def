"""Time to first token under load, inside the engine: closed-loop streams, one prefill policy after another.

    python scripts/wave_probe.py MODEL.gguf STREAMS REQUESTS POLICY [POLICY ...]

``POLICY`` is ``n_batch:n_prefill`` (``n_prefill`` ``-`` = what the running answers leave of n_batch), e.g.
``2048:512`` (the default) or ``512:-`` (the rule before run 9). Each of ``STREAMS`` clients sends a request (a distinct
128-token prompt, 128 greedy tokens), waits for its last token and sends the next, until ``REQUESTS`` were sent; as
``llamafleet bench`` does over HTTP, without the HTTP. Prints, per policy, TTFT p50/p90, the gap between tokens
p50/p90 and output tokens/s, so that a policy's effect is seen apart from the API path.
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


def quantile(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def run(model: str, streams: int, total: int, n_batch: int, n_prefill: int | None) -> str:
    cfg = EngineConfig(model_path=model, n_seq=streams, n_ctx_per_seq=1024, n_batch=n_batch, n_ubatch=512,
                       flash_attn=True, prefix_cache=False, prefill_tokens=n_prefill)
    with Engine(cfg) as engine:
        prompts = [tuple(engine.tokenize(f"{i} " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(126))))
                   for i in range(total + streams)]
        params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
        engine.generate([Request(f"w{i}", prompts[total + i], params) for i in range(streams)])  # warm-up
        sent, start, last, ttft, gaps, tokens = 0, {}, {}, [], [], 0

        def send() -> None:
            nonlocal sent
            rid = f"r{sent}"
            engine.add_request(Request(rid, prompts[sent], params))
            start[rid] = time.perf_counter()
            sent += 1

        for _ in range(min(streams, total)):
            send()
        t0 = time.perf_counter()
        while engine.has_work():
            for out in engine.step():
                now = time.perf_counter()
                if out.token_ids:
                    tokens += len(out.token_ids)
                    if out.request_id in last:
                        gaps.append(now - last[out.request_id])
                    else:
                        ttft.append(now - start[out.request_id])
                    last[out.request_id] = now
                if out.finished and sent < total:
                    send()
        wall = time.perf_counter() - t0
    return (f"n_batch {n_batch:5d}, n_prefill {n_prefill or '-':>5}: TTFT p50 {statistics.median(ttft) * 1e3:7.1f}"
            f" p90 {quantile(ttft, 0.9)*1e3:7.1f} ms; ITL p50 {statistics.median(gaps)*1e3:5.1f} p90"
            f" {quantile(gaps, 0.9)*1e3:6.1f} ms; {tokens / wall:7.0f} tok/s")


def main(model: str, streams: int, total: int, policies: list[str]) -> None:
    for p in policies:
        b, pf = p.split(":")
        print(run(model, streams, total, int(b), None if pf == "-" else int(pf)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
