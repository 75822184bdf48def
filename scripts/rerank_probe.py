"""One rerank call of many documents, timed on llamafleet and on llama-server side by side, rounds interleaved.

    python scripts/rerank_probe.py --fleet URL --server URL [--docs 64] [--tokens 200] [--rounds 5] [--out FILE]

Both servers serve the same reranker GGUF (scripts/rerank-bench.sh starts them). Each document is ``--tokens``
whole words of the synthetic reranker's vocabulary (one token each; llamafleet's ``/tokenize`` checks it). Each
round posts the same ``/v1/rerank`` request to both, in alternating order, so that both see the same load; the
ratio of each round (llamafleet / llama-server wall time) and their median are written, with the two servers'
scores compared (the same order; the largest difference).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from typing import Any

import httpx

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "hello", "world", "is"]  # whole tokens of model/synth_bert.py


def documents(n: int, tokens: int) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(tokens)) for _ in range(n)]


def call(url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/rerank", json=body, timeout=600)
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    return elapsed, r.json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleet", required=True, help="llamafleet's root URL")
    ap.add_argument("--server", required=True, help="llama-server's root URL")
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=200, help="tokens per document")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args()
    docs = documents(args.docs, args.tokens)
    counted = httpx.post(f"{args.fleet}/tokenize", json={"content": docs[0]}, timeout=60).json()["tokens"]
    assert len(counted) == args.tokens, f"a document is {len(counted)} tokens, not {args.tokens}"
    body = {"query": "is the cat on the mat", "documents": docs}
    call(args.fleet, body), call(args.server, body)  # warm-up: llamafleet creates its embedding context on first use
    fleet_s, server_s, ratios = [], [], []
    answers: dict[str, dict[str, Any]] = {}
    for r in range(args.rounds):
        order = [("llamafleet", args.fleet), ("llama-server", args.server)]
        times = {}
        for name, url in order if r % 2 == 0 else order[::-1]:
            times[name], answers[name] = call(url, body)
        fleet_s.append(times["llamafleet"])
        server_s.append(times["llama-server"])
        ratios.append(times["llamafleet"] / times["llama-server"])
        print(f"round {r}: llamafleet {times['llamafleet']:.3f}s, llama-server {times['llama-server']:.3f}s, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    ours = {x["index"]: x["relevance_score"] for x in answers["llamafleet"]["results"]}
    theirs = {x["index"]: x["relevance_score"] for x in answers["llama-server"]["results"]}
    result = {
        "docs": args.docs, "tokens_per_doc": args.tokens, "rounds": args.rounds,
        "prompt_tokens": {"llamafleet": answers["llamafleet"]["usage"]["prompt_tokens"],
                          "llama-server": answers["llama-server"]["usage"]["prompt_tokens"]},
        "llamafleet_s": fleet_s, "llama_server_s": server_s, "ratios": ratios,
        "median_ratio": statistics.median(ratios),
        "same_order": [x["index"] for x in answers["llamafleet"]["results"]]
        == [x["index"] for x in answers["llama-server"]["results"]],
        "score_max_abs_diff": max(abs(ours[i] - theirs[i]) for i in ours),
        "load_average": os.getloadavg(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
