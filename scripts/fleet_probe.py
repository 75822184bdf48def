"""A fleet of several models on a real GPU: loads on demand, evictions, memory planned vs measured, embeddings.

    python scripts/fleet_probe.py URL PINNED MODEL [MODEL ...]

Against a running ``llamafleet serve --config`` whose ``models:`` do not all fit at once (the ``fleet`` phase of
scripts/gpu-bench.sh makes such a budget with ``vram_margin_mib``): asks each model in turn, so loads and evictions
happen, and after each answer reads ``GET /v1/status`` for the GPU memory the planner reserved for the loaded
models against what NVML measures. Then two models at once under concurrent requests, and ``/v1/embeddings`` on the
pinned model, alone and beside streamed chats. Prints a markdown report.
"""

from __future__ import annotations

import concurrent.futures as cf
import sys
import time
from typing import Any

import httpx

MIB = 2**20
SCAN_WAIT_S = 2.5  # watchdog_interval_s (2 s by default) and some: the next NVML scan has happened


def chat(c: httpx.Client, model: str, max_tokens: int = 16, stream: bool = False) -> tuple[int, float]:
    t0 = time.perf_counter()
    body = {"model": model, "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}
    if stream:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            for _ in r.iter_lines():
                pass
            return r.status_code, time.perf_counter() - t0
    r = c.post("/v1/chat/completions", json=body)
    return r.status_code, time.perf_counter() - t0


def memory(c: httpx.Client) -> tuple[list[str], float, float]:
    """Loaded models, GPU 0's planned MiB (weights + KV + compute of every placed model) and its measured MiB, the
    latter from a watchdog scan taken after this call (the status endpoint shows the last one)."""
    time.sleep(SCAN_WAIT_S)
    s = c.get("/v1/status").json()
    loaded = [m["name"] for m in s["models"] if m["state"] == "loaded"]
    gpu = next(d for d in s["devices"] if d["index"] == 0)
    planned = sum(p["weights_mib"] + p["kv_mib"] + p["compute_mib"] for p in gpu["planned"])
    measured = gpu["measured"]["used_bytes"] / MIB if gpu["measured"] else float("nan")
    return loaded, planned, measured


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main(url: str, pinned: str, models: list[str]) -> None:
    out: list[str] = []
    with httpx.Client(base_url=url, timeout=600) as c:
        loaded, planned, measured = memory(c)
        out += ["| step | answer ms | loaded after | GPU 0 planned MiB | GPU 0 measured MiB |",
                "|---|---:|---|---:|---:|", f"| start | | {', '.join(loaded)} | {planned:,.0f} | {measured:,.0f} |"]
        for m in [*models, pinned, models[0]]:
            code, s = chat(c, m)
            loaded, planned, measured = memory(c)
            out.append(f"| ask {m} ({code}) | {s * 1e3:,.0f} | {', '.join(loaded)} | {planned:,.0f} | "
                       f"{measured:,.0f} |")
        with cf.ThreadPoolExecutor(16) as pool:
            t0 = time.perf_counter()
            codes = list(pool.map(lambda i: chat(c, models[i % 2], 32)[0], range(32)))
            wall = time.perf_counter() - t0
        out.append(f"\n32 requests alternating {models[0]} / {models[1]}, 16 at a time: {codes.count(200)} x 200 "
                   f"in {wall:.1f} s ({sorted(set(codes))})")
        inputs = [" ".join(["the quick brown fox jumps over the lazy dog"] * 12) + f" {i}" for i in range(64)]
        t0 = time.perf_counter()
        r = c.post("/v1/embeddings", json={"model": pinned, "input": inputs})
        alone = time.perf_counter() - t0
        body: dict[str, Any] = r.json()
        dims = len(body["data"][0]["embedding"]) if r.status_code == 200 else 0
        with cf.ThreadPoolExecutor(9) as pool:
            streams = [pool.submit(chat, c, pinned, 128, True) for _ in range(8)]
            time.sleep(0.2)
            t0 = time.perf_counter()
            r2 = c.post("/v1/embeddings", json={"model": pinned, "input": inputs})
            beside = time.perf_counter() - t0
            chats = [f.result() for f in streams]
        out.append(f"\n/v1/embeddings, {pinned}, 64 inputs of {body.get('usage', {}).get('prompt_tokens', 0) // 64} "
                   f"tokens: {r.status_code}, {dims} dimensions, {alone * 1e3:,.0f} ms alone; {r2.status_code}, "
                   f"{beside * 1e3:,.0f} ms beside 8 streamed chats of 128 tokens (those took "
                   f"{max(s for _, s in chats) * 1e3:,.0f} ms, {[code for code, _ in chats].count(200)} x 200)")
        text = c.get("/metrics").text
        out.append("\n| model | loads | load s (mean) | evictions |\n|---|---:|---:|---:|")
        for m in [pinned, *models]:
            n = metric(text, "llamafleet_model_load_seconds_count", model=m)
            s = metric(text, "llamafleet_model_load_seconds_sum", model=m)
            ev = metric(text, "llamafleet_model_evictions_total", model=m)
            out.append(f"| {m} | {n:.0f} | {s / n if n else float('nan'):.2f} | {ev:.0f} |")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
