"""Summarise a scripts/gpu-bench.sh run folder into one markdown report (printed to stdout).

Reads what the phases left: llama-bench.json, batched-bench.jsonl, engine-*.json, decode-probe.txt, <label>/bench.json
(sweeps, one per batch size with BATCHES, multi-turn replays and the torch phase's runs), dmon-*.log, plan-*.txt,
mem-*.csv, status-*.json, graphs-*.txt and consistency/.
Missing pieces are skipped, so a partial run still reports.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a and b else "—"


def num(v: float | None, fmt: str = ".1f") -> str:
    return format(v, fmt) if v is not None else "—"


def pct(v: float | None) -> str:
    return f"{100 * v:.0f}%" if v is not None else "—"


def llama_bench(d: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for e in load(d / "llama-bench.json") or []:
        if e.get("n_gen", 0) > 0 and e.get("n_prompt", 0) == 0:
            out[f"tg{e['n_gen']}"] = float(e["avg_ts"])
        elif e.get("n_prompt", 0) > 0 and e.get("n_gen", 0) == 0:
            out[f"pp{e['n_prompt']}"] = float(e["avg_ts"])
    return out


def batched_bench(d: Path) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    p = d / "batched-bench.jsonl"
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if "pl" in e:
                out[int(e["pl"])] = {"S_TG": float(e["speed_tg"]), "S_PP": float(e["speed_pp"]),
                                     "S": float(e["speed"])}
    return out


# engine-<n>-<variant>.json: how each variant was run (see the engine phase of gpu-bench.sh)
ENGINE_VARIANTS = (("overlap", "argmax on the host, decode overlapped with text work (default)"),
                   ("serial", "argmax on the host, one pass at a time (--no-overlap)"),
                   ("backend", "sampling in llama.cpp's graph (--backend-sampling)"))


def engine(d: Path, n: int, variant: str) -> dict[str, Any] | None:
    r = load(d / f"engine-{n}-{variant}.json")
    if not r:
        return None
    conc = [p for p in r["phases"] if p["name"] == "concurrent"][0]
    return dict(conc)


def http(d: Path, label: str) -> dict[int, dict[str, Any]]:
    r = load(d / label / "bench.json")
    return {lv["concurrency"]: lv for lv in r["levels"]} if r else {}


def batch_runs(d: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """The serve phase's llamafleet runs by policy (BATCHES with more than one entry: llamafleet-1gpu-b<B>[-<P>]),
    named "batch B, prefill P"."""
    runs = {}
    for p in d.glob("llamafleet-1gpu-b*"):
        b, _, pf = p.name.rsplit("-b", 1)[1].partition("-")
        runs[f"batch {b}, prefill {pf or 512}"] = http(d, p.name)
    return runs


def batch_sweep(d: Path, ls: dict[int, dict[str, Any]]) -> None:
    runs = batch_runs(d)
    if not runs:
        return
    print("\n## Prefill policy: llamafleet's batch_size and prefill_tokens (n_ubatch 512) vs llama-server\n")
    print("| streams | server | output tok/s | steady tok/s | TTFT ms p50/p90 | ITL ms p50/p90 |\n"
          "|---:|---|---:|---:|---|---|")
    named = [(f"llamafleet, {name}", runs[name]) for name in sorted(runs)] + [("llama-server -b 2048 -ub 512", ls)]
    for c in sorted({c for _, r in named for c in r}):
        for name, r in named:
            lv = r.get(c)
            if lv:
                t, i = lv.get("ttft_ms") or {}, lv.get("itl_ms") or {}
                print(f"| {c} | {name} | {num(lv.get('output_tok_s'))} | {num(lv.get('steady_tok_s'))} | "
                      f"{num(t.get('p50'), '.0f')}/{num(t.get('p90'), '.0f')} | "
                      f"{num(i.get('p50'))}/{num(i.get('p90'))} |")


TORCH_LABELS = (("torch-f16", "torch, fp16 checkpoint, CUDA graphs"),
                ("torch-f16-eager", "torch, fp16 checkpoint, eager"),
                ("gguf-f16", "llama.cpp, F16 GGUF"), ("gguf-q8_0", "llama.cpp, Q8_0 GGUF"))


def torch_engine(d: Path) -> None:
    """The torch phase: each run at 1 and 32 streams over HTTP (with its replica's graph_steps from /v1/status), then
    the in-process runs with CUDA graphs and without."""
    runs = [(label, name, http(d, label)) for label, name in TORCH_LABELS]
    engines = [(g, load(d / f"engine-torch-{g}.json")) for g in ("auto", "off")]
    if not any(r for _, _, r in runs) and not any(e for _, e in engines):
        return
    base = http(d, "gguf-f16").get(32, {}).get("output_tok_s")
    print("\n## The torch engine against the GGUF engine (7B shape, one GPU, 32 slots)\n")
    print("| run | 1 stream tok/s | ITL p50 ms | 32 streams tok/s (steady) | ITL p50 ms | vs F16 GGUF | graph steps |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for label, name, r in runs:
        if r:
            one, many = r.get(1, {}), r.get(32, {})
            status = load(d / f"status-{label}.json") or {}
            steps = sum(x.get("graph_steps", 0) for x in status.get("replicas", []))
            print(f"| {name} | {num(one.get('output_tok_s'))} | {num((one.get('itl_ms') or {}).get('p50'))} | "
                  f"{num(many.get('output_tok_s'))} ({num(many.get('steady_tok_s'))}) | "
                  f"{num((many.get('itl_ms') or {}).get('p50'))} | {ratio(many.get('output_tok_s'), base)} | "
                  f"{steps if status else '—'} |")
    for g, e in engines:
        if e:
            for p in e["phases"]:
                print(f"\nin-process, cuda_graphs {g}, {p['name']}: {num(p['tokens_per_s'])} tok/s, "
                      f"{p['steps']} steps ({p['graph_steps']} from graphs), "
                      f"{num(1000 * p['step_seconds'] / max(1, p['steps']), '.2f')} ms/step")
    for label, _ in TORCH_LABELS:
        p = d / f"graphs-{label}.txt"
        if p.exists() and p.read_text().strip():
            print(f"\n`graphs-{label}.txt`:\n```\n{p.read_text().strip()[:1500]}\n```")


def multiturn(d: Path) -> None:
    found = [d / name / "bench.md" for name in ("llamafleet-multiturn", "llama-server-multiturn")]
    if not any(p.exists() for p in found):
        return
    print("\n## Multi-turn replay (32 conversations x 4 turns, 1300-token shared system prompt, one GPU)\n")
    for p in found:
        if p.exists():
            print(p.read_text().strip() + "\n")
    for name in ("multiturn-compare/compare.md", "multiturn-metrics.txt"):
        p = d / name
        if p.exists():
            print(f"`{name}`:\n```\n{p.read_text().strip()[:3000]}\n```\n")


def dmon_util(d: Path, name: str) -> str:
    p = d / f"dmon-{name}.log"
    if not p.exists():
        return "—"
    sm: list[float] = []
    for line in p.read_text().splitlines():
        parts = line.split()
        if parts and parts[0].isdigit() and len(parts) > 1 and parts[1].isdigit():
            sm.append(float(parts[1]))
    busy = [x for x in sm if x > 0]
    return f"{statistics.mean(busy):.0f}% mean SM while busy ({len(busy)} s)" if busy else "—"


def main(d: Path) -> None:
    lb, bb = llama_bench(d), batched_bench(d)
    lf, ls = http(d, "llamafleet-1gpu"), http(d, "llama-server-1gpu")
    if not lf and batch_runs(d):  # BATCHES with several entries: the defaults stand for llamafleet in the tables
        runs = batch_runs(d)
        lf = runs.get("batch 2048, prefill 512") or runs[min(runs)]
    print("# GPU benchmark report\n")
    run_log = d / "run.log"
    if run_log.exists():
        info = [ln for ln in run_log.read_text().splitlines() if "CUDA" in ln or "CPU :" in ln]
        if info:
            print("llama.cpp build: `" + info[-1].strip()[:200] + "`\n")
    print("## Single stream (7B Q4_0, one GPU)\n")
    print("| measure | tok/s | vs llama-bench tg128 |\n|---|---:|---:|")
    tg = lb.get("tg128")
    print(f"| llama-bench tg128 | {num(tg)} | 1.000 |")
    print(f"| llama-bench pp512 (prompt) | {num(lb.get('pp512'))} | |")
    for variant, what in ENGINE_VARIANTS:
        e = engine(d, 1, variant)
        if e:
            print(f"| llamafleet engine in-process, {what} | {num(e['tokens_per_s'])} | "
                  f"{ratio(e['tokens_per_s'], tg)} |")
    if 1 in lf:
        s = lf[1]["stream_tok_s"]["p50"] if lf[1].get("stream_tok_s") else None
        print(f"| llamafleet HTTP streaming, per-stream p50 | {num(s)} | {ratio(s, tg)} |")
    if 1 in ls:
        s = ls[1]["stream_tok_s"]["p50"] if ls[1].get("stream_tok_s") else None
        print(f"| llama-server HTTP streaming, per-stream p50 | {num(s)} | {ratio(s, tg)} |")

    print("\n## 128 concurrent sequences (7B Q4_0, one GPU)\n")
    print("| measure | generated tok/s | vs batched-bench S_TG | host time per step (of which sampling) |\n"
          "|---|---:|---:|---:|")
    stg = bb.get(128, {}).get("S_TG")
    print(f"| llama-batched-bench S_TG (pp128/tg128, 128 seq) | {num(stg)} | 1.000 | |")
    for variant, what in ENGINE_VARIANTS:
        e = engine(d, 128, variant)
        if e:
            print(f"| llamafleet engine in-process, {what} | {num(e['tokens_per_s'])} | "
                  f"{ratio(e['tokens_per_s'], stg)} | {e['overhead_ms_per_step']:.2f} ms "
                  f"({e.get('sample_ms_per_step', 0.0):.2f} ms) |")
            if e.get("steady_tokens_per_s"):
                print(f"| llamafleet engine in-process, {what}, steady (every sequence generating) | "
                      f"{num(e['steady_tokens_per_s'])} | {ratio(e['steady_tokens_per_s'], stg)} | |")
    for name, runs in (("llamafleet", lf), ("llama-server", ls)):
        if 128 in runs:
            lv = runs[128]
            print(f"| {name} HTTP, 128 streams, all of the run (prefill included) | {num(lv['output_tok_s'])} | "
                  f"{ratio(lv['output_tok_s'], stg)} | |")
            print(f"| {name} HTTP, 128 streams, steady (all streams generating) | {num(lv.get('steady_tok_s'))} | "
                  f"{ratio(lv.get('steady_tok_s'), stg)} | |")
    probe = d / "decode-probe.txt"
    if probe.exists() and probe.read_text().strip():
        print("\nDecode probe (scripts/decode_probe.py: llama.cpp's loop through llamafleet's bindings, no engine):\n")
        print(probe.read_text().strip())
    if 128 in lf and 128 in ls:
        r = ratio(lf[128]["output_tok_s"], ls[128]["output_tok_s"])
        rs = ratio(lf[128].get("steady_tok_s"), ls[128].get("steady_tok_s"))
        print(f"\nllamafleet / llama-server at 128 streams: **{r}x** over the whole run, **{rs}x** steady")

    if lf or ls:
        print("\n## Concurrency sweep over HTTP (7B Q4_0, one GPU, 128-token prompts, 128-token answers)\n")
        print("| streams | llamafleet tok/s | llama-server tok/s | ratio | steady: llamafleet | llama-server | "
              "ratio | TTFT p50 ms (lf/ls) | client CPU (lf/ls) | errors (lf/ls) |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
        for c in sorted(set(lf) | set(ls)):
            a, b = lf.get(c, {}), ls.get(c, {})
            ta = a.get("ttft_ms", {}) or {}
            tb = b.get("ttft_ms", {}) or {}
            print(f"| {c} | {num(a.get('output_tok_s'))} | {num(b.get('output_tok_s'))} | "
                  f"{ratio(a.get('output_tok_s'), b.get('output_tok_s'))} | {num(a.get('steady_tok_s'))} | "
                  f"{num(b.get('steady_tok_s'))} | {ratio(a.get('steady_tok_s'), b.get('steady_tok_s'))} | "
                  f"{num(ta.get('p50'), '.0f')}/{num(tb.get('p50'), '.0f')} | "
                  f"{pct(a.get('client_cpu'))}/{pct(b.get('client_cpu'))} | "
                  f"{a.get('errors', '—')}/{b.get('errors', '—')} |")
        print(f"\nGPU utilization (nvidia-smi dmon): llamafleet {dmon_util(d, 'llamafleet-1gpu')}; "
              f"llama-server {dmon_util(d, 'llama-server-1gpu')}")

    batch_sweep(d, ls)
    multiturn(d)
    torch_engine(d)

    multi = sorted(d.glob("llamafleet-[2-8]gpu"))
    for m in multi:
        runs = http(d, m.name)
        print(f"\n## Data parallel: {m.name} (one replica per GPU, one endpoint)\n")
        print("| streams | tok/s | vs one GPU at 128 streams | steady tok/s | vs one GPU steady | client CPU |\n"
              "|---:|---:|---:|---:|---:|---:|")
        base, sbase = lf.get(128, {}).get("output_tok_s"), lf.get(128, {}).get("steady_tok_s")
        for c, lv in sorted(runs.items()):
            print(f"| {c} | {num(lv['output_tok_s'])} | {ratio(lv['output_tok_s'], base)} | "
                  f"{num(lv.get('steady_tok_s'))} | {ratio(lv.get('steady_tok_s'), sbase)} | "
                  f"{pct(lv.get('client_cpu'))} |")
        print(f"\nGPU utilization: {dmon_util(d, m.name)}")

    split = {mode: http(d, f"llamafleet-70b-{mode}") for mode in ("tensor", "layer")}
    if any(split.values()):
        print("\n## 70B Q4_0 split over the GPUs\n")
        print("| mode | 1 stream tok/s | 32 streams tok/s |\n|---|---:|---:|")
        for mode, runs in split.items():
            one = runs.get(1, {}).get("stream_tok_s") or {}
            print(f"| {mode} | {num(one.get('p50'))} | {num(runs.get(32, {}).get('output_tok_s'))} |")
        for mode in ("tensor", "layer"):
            for name in (f"plan-70b-{mode}.txt", f"mem-70b-{mode}.csv"):
                p = d / name
                if p.exists():
                    print(f"\n`{name}`:\n```\n{p.read_text().strip()[:3000]}\n```")
    cons = d / "consistency" / "consistency.md"
    if cons.exists():
        print("\n## Consistency\n")
        print(cons.read_text())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
