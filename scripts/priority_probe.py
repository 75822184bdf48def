"""Where an interactive request's time to first token goes beside a batch flood, in the engine itself (no HTTP).

    python scripts/priority_probe.py [--flood 200] [--every 2] [--slots 4] [--rounds 2] [--json OUT]

Drives two :class:`~llamafleet.engine.engine.Engine` engines of the demo model the way a CPU replica's worker does (one
pass per step, ``overlap`` off), one with the scheduler's pass shares on, one with them off (``priorities.batch_share``
null), and repeats, ``--rounds`` times, side by side: ``alone`` (the interactive client only: one request every
``--every`` s, the next sent when the last one is answered and that time has passed), ``flood_off``, ``flood_on``
(the batch tenant sends ``--flood`` requests at once, class 2; the interactive one class 0, as above). Each step's
plan is read (the engine's ``schedule`` is wrapped), so each interactive request's TTFT splits into:

* ``arrive_s``: from the request to the end of the step running when it came (it is taken in between steps);
* ``admit_s``: steps before the first one whose plan holds it (waiting for a slot, or a prompt queued before it);
* ``prefill_s``: the steps whose plans hold its prompt, up to the one that samples its first token;

and each of those prefill steps into what else it held: other classes' prompt tokens and decode rows. Times are the
steps' wall times; counts are exact. ``ttft_cpu_s``: the same TTFT in the process's CPU time (the arrival step's
part after the request, then each step up to the first token), what a core of its own would give: on a shared
machine a busy process is descheduled more than one that mostly sleeps, which inflates the flood's wall times.

The numbers are in docs/BENCHMARKS.md ("Tenants").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import llamafleet.engine.engine as engine_module

from llamafleet.engine.engine import Engine  # isort: skip  (llama.cpp before numpy: see engine/llama.py)

from llamafleet.engine.sequence import Sequence
from llamafleet.engine.types import EngineConfig, PriorityConfig, Request, SamplingParams
from llamafleet.model.demo import default_model_path

Plan = list[tuple[Sequence, int]]


class Recorder:
    """Wraps the engine module's ``schedule``: keeps the last plan, as (request id, priority, tokens, prompt?)."""

    def __init__(self) -> None:
        self.plan: list[tuple[str, int, int, bool]] = []
        inner: Callable[..., Plan] = vars(engine_module)["schedule"]

        def wrapped(*args: Any, **kw: Any) -> Plan:
            plan = inner(*args, **kw)
            self.plan = [(s.request_id, s.req.priority, k, s.pending > 1 or s.n_cached < s.n_prompt) for s, k in plan]
            return plan

        vars(engine_module)["schedule"] = wrapped


def run_phase(eng: Engine, rec: Recorder, args: argparse.Namespace, flood: bool, tag: str) -> dict[str, Any]:
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    chat_params = SamplingParams(max_tokens=args.chat_tokens, temperature=0.0, ignore_eos=True)
    if flood:
        for i in range(args.flood):
            eng.add_request(Request(f"{tag}-b{i}", tuple(eng.tokenize(f"Item {i}: write a list of fruits.")), params,
                                    2, "bulk"))
    bulk_left = args.flood if flood else 0
    started = time.perf_counter()
    chats: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    next_at = free_at = time.perf_counter() + (1.0 if flood else 0.0)
    steps: list[dict[str, Any]] = []
    while bulk_left or (not flood and len(chats) < args.alone) or current is not None:
        now = time.perf_counter()
        if current is None and now >= next_at and (bulk_left or not flood and len(chats) < args.alone):
            i = len(chats)
            rid = f"{tag}-c{i}"
            eng.add_request(Request(rid, tuple(eng.tokenize(f"Question {i}: what is the capital of France?")),
                                    chat_params, 0, "chat"))
            sent = max(next_at, free_at)  # (it came during the step that just ended: the engine takes it now)
            last = steps[-1] if steps else None  # the step it came during: its part after the request, in CPU time
            cpu = last["cpu"] * min(1.0, max(0.0, (last["end"] - sent) / last["s"])) if last else 0.0
            arrive = last["end"] - sent if last and last["end"] - last["s"] <= sent < last["end"] else 0.0
            current = {"id": rid, "sent": sent, "admit_step": None, "steps": [], "cpu": cpu, "arrive_s": arrive}
            next_at = sent + args.every
        if not eng.has_work():
            time.sleep(0.005)
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        outs = eng.step()
        t1, c1 = time.perf_counter(), time.process_time()
        steps.append({"s": t1 - t0, "cpu": c1 - c0, "end": t1, "rows": len(rec.plan),
                      "tokens": sum(k for _, _, k, _ in rec.plan)})
        if current is not None and "ttft_s" not in current:
            current["cpu"] += c1 - c0
        if current is not None:
            mine = [p for p in rec.plan if p[0] == current["id"]]
            if mine and current["admit_step"] is None:
                current["admit_step"] = (t0, len(steps) - 1)
            if mine and mine[0][3]:
                others = [p for p in rec.plan if p[0] != current["id"]]
                current["steps"].append({"s": t1 - t0, "own_tokens": mine[0][2],
                                         "other_prompt_tokens": sum(k for _, _, k, pre in others if pre),
                                         "other_decode_rows": sum(1 for *_, pre in others if not pre)})
        for out in outs:
            if out.finished and out.request_id.startswith(f"{tag}-b"):
                bulk_left -= 1
            if current is not None and out.request_id == current["id"]:
                if out.token_ids and "ttft_s" not in current:
                    current["ttft_s"] = t1 - current["sent"]
                    first_step_start = current["admit_step"][0] if current["admit_step"] else t1
                    current["prefill_s"] = sum(s["s"] for s in current["steps"])
                    current["admit_s"] = max(0.0, first_step_start - current["sent"] - current["arrive_s"])
                if out.finished:
                    free_at = t1
                    chats.append(current)
                    current = None
    ttfts = [c["ttft_s"] for c in chats]
    cpus = [c["cpu"] for c in chats]
    by_tokens: dict[int, list[float]] = defaultdict(list)
    for st in steps:
        by_tokens[min(st["tokens"], 16)].append(st["s"])
    shared = [s for c in chats for s in c["steps"]]
    return {"phase": tag, "chat_requests": len(chats), "ttft_p50_s": med(ttfts), "ttft_cpu_p50_s": med(cpus),
            "arrive_p50_s": med([c["arrive_s"] for c in chats]), "admit_p50_s": med([c["admit_s"] for c in chats]),
            "prefill_p50_s": med([c["prefill_s"] for c in chats]),
            "prefill_steps_mean": round(len(shared) / len(chats), 2) if chats else None,
            "prefill_step_s_p50": med([s["s"] for s in shared]),
            "prefill_steps_with_other_prompts": sum(1 for s in shared if s["other_prompt_tokens"]),
            "prefill_steps_other_decode_rows_mean": round(statistics.mean(s["other_decode_rows"] for s in shared), 2)
            if shared else None,
            "step_s_p50_all": med([s["s"] for s in steps]), "steps": len(steps),
            "step_s_p50_by_tokens": {k: [med(v), len(v)] for k, v in sorted(by_tokens.items())},
            "span_s": round(time.perf_counter() - started, 2),
            "ttft_s": [round(t, 4) for t in ttfts], "ttft_cpu_s": [round(t, 4) for t in cpus],
            "parts": [[round(c[k], 4) for k in ("arrive_s", "admit_s", "prefill_s")] for c in chats]}


def med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flood", type=int, default=200)
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--alone", type=int, default=6)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--chat-tokens", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--share", type=float, default=PriorityConfig.batch_share, help="batch_share with the rules on")
    ap.add_argument("--alone-cost", type=float, default=PriorityConfig.batch_alone_cost,
                    help="batch_alone_cost with the rules on")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rec = Recorder()
    cfg = EngineConfig(model_path=str(default_model_path(progress=False)), n_seq=args.slots, n_ctx_per_seq=512,
                       n_batch=2048, n_threads=args.threads, overlap=False)
    result: dict[str, Any] = {"cpus": os.cpu_count(), "load_1min_at_start": os.getloadavg()[0], "phases": [],
                              "args": {k: v for k, v in vars(args).items() if k != "json"}}
    on = replace(cfg, priorities=PriorityConfig(batch_share=args.share, batch_alone_cost=args.alone_cost))
    off = replace(cfg, priorities=PriorityConfig(batch_share=None))  # the slot kept, passes shared as before
    with Engine(on) as eng_on, Engine(off) as eng_off:
        for eng in (eng_on, eng_off):
            eng.generate([Request("warm", tuple(eng.tokenize("warm up")), SamplingParams(max_tokens=2))])
        for r in range(args.rounds):
            for tag, flood, eng in (("alone", False, eng_on), ("flood_off", True, eng_off), ("flood_on", True, eng_on)):
                phase = run_phase(eng, rec, args, flood, f"{tag}{r}")
                print(json.dumps({k: v for k, v in phase.items() if k not in ("ttft_s", "ttft_cpu_s", "parts")}),
                      flush=True)
                result["phases"].append(phase)
    result["load_1min_at_end"] = os.getloadavg()[0]
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
