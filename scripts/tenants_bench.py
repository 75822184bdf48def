"""Priorities and fair shares between API keys, measured against a running server from the client's side.

    python scripts/tenants_bench.py --url URL --keys-file KEYS.yaml [--flood 200] [--every 2] [--json OUT]

The server must serve ``--keys-file`` (``serve --api-keys-file``); this script rewrites that file between phases
and waits for the server to reload it. Start the server with a queue that holds the flood (``--max-queue 1024
--max-queue-per-replica 1024``), so that the flood waits instead of being refused.

Phases, in this order (A and B side by side in one run, on one server):

1. ``alone``: the interactive key ``chat`` sends one request every ``--every`` seconds, nothing else runs.
2. ``flood_one_queue``: the batch key ``bulk`` sends ``--flood`` requests at once while the interactive client goes on
   sending one every ``--every`` seconds with the same key, until the flood is answered: one tenant, one class, one
   queue (the behaviour without tenants).
3. ``flood_fair``: the same, the interactive client with its own key ``chat``, both keys in the default class (fair
   shares only).
4. ``alone`` again (the machine may have changed), then ``flood_priority``: ``chat`` interactive, ``bulk`` batch.
5. ``fairness``: both keys in one class; ``many`` sends ``--many`` requests at once, and once they fill the slots
   ``one`` sends one request and ``many`` one more (the control, queued at the same moment). For the lone request:
   its time to first token, and how many of ``many``'s requests started (first token) after it was sent and before it.

The time to first token (TTFT) of ``chat`` is compared by median: the flood's penalty is ``flood / alone``.

With ``--off-url URL --off-keys-file KEYS.yaml`` (a second server of the same model, started with ``priorities:
{batch_share: null}``: the scheduler's pass shares off, the slot kept as before) only the priority flood is run, on
both servers in turns, ``--rounds`` times (``alone`` then ``flood_priority`` on one, then on the other; the server
that goes first alternates): the shares on and off side by side, each penalty against its own server's ``alone``.

The numbers are in docs/BENCHMARKS.md ("Tenants").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from llamafleet.bench.streaming import RequestResult, Target, resolve_model, send

FLAT = "keys:\n  - {name: chat, key: k-chat}\n  - {name: bulk, key: k-bulk}\n  - {name: many, key: k-many}\n" \
       "  - {name: one, key: k-one}\n  - {name: ops, key: k-ops, scopes: [admin, metrics, inference]}\n"
PRIORITY = FLAT.replace("{name: chat, key: k-chat}", "{name: chat, key: k-chat, priority: interactive}").replace(
    "{name: bulk, key: k-bulk}", "{name: bulk, key: k-bulk, priority: batch}")


def use_keys(url: str, path: Path, text: str) -> None:
    """Write the keys file and wait until the server answers with it (a key only the new file knows)."""
    marker = f"k-mark-{time.monotonic_ns()}"
    path.write_text(text + f"  - {{name: mark, key: {marker}}}\n", encoding="utf-8")
    for _ in range(200):
        if httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {marker}"}, timeout=30).status_code == 200:
            return
        time.sleep(0.1)
    raise SystemExit("the server did not reload the keys file within 20 s: does it serve --api-keys-file?")


async def ask(url: str, model: str, key: str, max_tokens: int, prompt: str) -> RequestResult:
    target = Target(url, model, max_tokens=max_tokens, api_key=key, timeout=3600)
    conn = target.connection()
    try:
        return await send(conn, target, target.body() | {"prompt": prompt})
    finally:
        await conn.close()


def ttft(r: RequestResult) -> float | None:
    return r.chunk_times[0] if r.ok and r.chunk_times else None


async def interactive_while(url: str, model: str, every: float, busy: asyncio.Task[Any] | None,
                            n: int, max_tokens: int, key: str = "k-chat") -> list[RequestResult]:
    """``key`` sends one request every ``every`` s: ``n`` of them, or (with ``busy``) until ``busy`` is done."""
    results: list[RequestResult] = []
    i = 0
    while (busy is None and i < n) or (busy is not None and not busy.done()):
        t0 = time.perf_counter()
        results.append(await ask(url, model, key, max_tokens, f"Question {i}: what is the capital of France?"))
        i += 1
        await asyncio.sleep(max(0.0, every - (time.perf_counter() - t0)))
    return results


async def flood(url: str, model: str, key: str, n: int, max_tokens: int) -> list[RequestResult]:
    return list(await asyncio.gather(*(ask(url, model, key, max_tokens, f"Item {i}: write a list of fruits.")
                                       for i in range(n))))


def summary(chat: list[RequestResult], bulk: list[RequestResult] | None = None) -> dict[str, Any]:
    times = [t for t in map(ttft, chat) if t is not None]
    out: dict[str, Any] = {"chat_requests": len(chat), "chat_failed": sum(not r.ok for r in chat),
                           "chat_ttft_s": [round(t, 4) for t in times],
                           "chat_ttft_p50_s": round(statistics.median(times), 4) if times else None}
    if bulk is not None:
        out |= {"bulk_requests": len(bulk), "bulk_failed": sum(not r.ok for r in bulk),
                "bulk_span_s": round(max(r.sent_at + r.latency for r in bulk) - min(r.sent_at for r in bulk), 2)}
    return out


async def flood_phase(url: str, model: str, args: argparse.Namespace, key: str = "k-chat") -> dict[str, Any]:
    bulk = asyncio.create_task(flood(url, model, "k-bulk", args.flood, args.max_tokens))
    await asyncio.sleep(1.0)  # the flood is in
    chat = await interactive_while(url, model, args.every, bulk, 0, args.chat_tokens, key)
    return summary(chat, await bulk)


async def fairness(url: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    many = asyncio.create_task(flood(url, model, "k-many", args.many, args.max_tokens))
    await asyncio.sleep(args.settle)  # the slots are full, the rest queued
    sent = time.perf_counter()
    lone, control = await asyncio.gather(ask(url, model, "k-one", args.max_tokens, "A lone question: why?"),
                                         ask(url, model, "k-many", args.max_tokens, "A control question: why?"))
    rest = await many
    lone_start = sent + (ttft(lone) or float("nan"))
    starts = [r.sent_at + t for r in rest if (t := ttft(r)) is not None]
    ends = sorted(r.sent_at + r.latency for r in rest if r.ok)
    gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return {"many": args.many, "lone_ttft_s": ttft(lone), "control_ttft_s": ttft(control),
            "many_started_between_lone_sent_and_its_start": sum(sent < s < lone_start for s in starts),
            "median_gap_between_finishes_s": round(statistics.median(gaps), 4) if gaps else None,
            "failed": sum(not r.ok for r in [*rest, lone, control])}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    url, keys = args.url.rstrip("/"), Path(args.keys_file)
    use_keys(url, keys, FLAT)
    model = resolve_model(url, "k-chat")
    await ask(url, model, "k-chat", 2, "warm up")
    result: dict[str, Any] = {"model": model, "flood": args.flood, "every_s": args.every,
                              "max_tokens": args.max_tokens, "chat_tokens": args.chat_tokens,
                              "cpus": os.cpu_count(), "load_1min_at_start": os.getloadavg()[0]}
    result["alone_before"] = summary(await interactive_while(url, model, args.every, None, args.alone,
                                                             args.chat_tokens))
    result["flood_one_queue"] = await flood_phase(url, model, args, "k-bulk")
    result["flood_fair"] = await flood_phase(url, model, args)
    result["alone_between"] = summary(await interactive_while(url, model, args.every, None, args.alone,
                                                              args.chat_tokens))
    use_keys(url, keys, PRIORITY)
    result["flood_priority"] = await flood_phase(url, model, args)
    use_keys(url, keys, FLAT)
    result["fairness"] = await fairness(url, model, args)
    alone = statistics.median([result["alone_before"]["chat_ttft_p50_s"], result["alone_between"]["chat_ttft_p50_s"]])
    for phase in ("one_queue", "fair", "priority"):
        result[f"penalty_{phase}"] = round(result[f"flood_{phase}"]["chat_ttft_p50_s"] / alone, 2)
    result["load_1min_at_end"] = os.getloadavg()[0]
    return result


async def compare(args: argparse.Namespace) -> dict[str, Any]:
    """The priority flood with the scheduler's shares on (``--url``) and off (``--off-url``), in turns."""
    servers = {"on": (args.url.rstrip("/"), Path(args.keys_file)), "off": (args.off_url.rstrip("/"),
                                                                          Path(args.off_keys_file))}
    model = ""
    for url, keys in servers.values():
        use_keys(url, keys, PRIORITY)
        model = resolve_model(url, "k-chat")
        await ask(url, model, "k-chat", 2, "warm up")
    result: dict[str, Any] = {"model": model, "flood": args.flood, "every_s": args.every, "rounds": args.rounds,
                              "max_tokens": args.max_tokens, "chat_tokens": args.chat_tokens, "cpus": os.cpu_count(),
                              "load_1min_at_start": os.getloadavg()[0], "phases": []}
    for r in range(args.rounds):
        for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
            url, _ = servers[name]
            alone = summary(await interactive_while(url, model, args.every, None, args.alone, args.chat_tokens))
            flooded = await flood_phase(url, model, args)
            result["phases"].append({"round": r, "shares": name, "load_1min": os.getloadavg()[0], "alone": alone,
                                     "flood_priority": flooded, "penalty": round(flooded["chat_ttft_p50_s"]
                                                                                 / alone["chat_ttft_p50_s"], 2)})
            print(json.dumps(result["phases"][-1] | {"alone": "...", "flood_priority": "..."}), flush=True)
    for name in servers:
        mine = [p for p in result["phases"] if p["shares"] == name]
        alone_all = [t for p in mine for t in p["alone"]["chat_ttft_s"]]
        flood_all = [t for p in mine for t in p["flood_priority"]["chat_ttft_s"]]
        result[f"pooled_{name}"] = {"alone_p50_s": round(statistics.median(alone_all), 4),
                                    "flood_p50_s": round(statistics.median(flood_all), 4),
                                    "penalty": round(statistics.median(flood_all) / statistics.median(alone_all), 2),
                                    "flood_span_s": [p["flood_priority"]["bulk_span_s"] for p in mine]}
    result["load_1min_at_end"] = os.getloadavg()[0]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--keys-file", required=True, help="the file the server reads as api_keys_file (rewritten)")
    ap.add_argument("--flood", type=int, default=200)
    ap.add_argument("--every", type=float, default=2.0)
    ap.add_argument("--alone", type=int, default=6, help="interactive requests in each 'alone' phase")
    ap.add_argument("--max-tokens", type=int, default=16, help="of the flood's and the fairness run's requests")
    ap.add_argument("--chat-tokens", type=int, default=8, help="of the interactive requests")
    ap.add_argument("--many", type=int, default=100)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds between the 'many' burst and the lone request")
    ap.add_argument("--json", default=None, help="write the numbers here too")
    ap.add_argument("--off-url", default=None, help="a second server with the scheduler's shares off: compare")
    ap.add_argument("--off-keys-file", default=None, help="the keys file that server reads (rewritten)")
    ap.add_argument("--rounds", type=int, default=2, help="with --off-url: turns of each server")
    args = ap.parse_args()
    if (args.off_url is None) != (args.off_keys_file is None):
        ap.error("--off-url and --off-keys-file go together")
    result = asyncio.run(run(args) if args.off_url is None else compare(args))
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
