"""When each turn of a by-turn session replay is sent and how long its first token takes, request by request: the
replay of scripts/sessions-bench.sh (``bench multiturn --by-turn``: 6 sessions x 3 turns, 870 private words each,
25-word user lines, 32-token answers, greedy), whose report gives only each turn's percentiles.

    python scripts/turn_probe.py URL [CONCURRENCY]

Shows whether later turns arrive together (the replay's workers start a turn together and, with answers of one
length, stay in step) and how a server serves two prompts that arrive together: one after the other (the first
answer starts after its own prefill) or in one pass (both after both). docs/BENCHMARKS.md, "Sessions on CPU: the
floor of a later turn".
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator

import httpx

from llamafleet.bench.multiturn import Conversation, MultiTurnConfig


async def main(url: str, conc: int) -> None:
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    cfg = MultiTurnConfig(url=url, model=model, conversations=6, turns=3, system_tokens=0, private_tokens=870,
                          concurrency=conc, by_turn=True, max_tokens=32, seed=7)
    convs = [Conversation.make(cfg, i) for i in range(cfg.conversations)]
    rows: list[tuple[int, int, float, float, float]] = []

    async def one(client: httpx.AsyncClient, c: Conversation, turn: int, t0: float) -> None:
        _, body = c.request(cfg)
        sent, first, text = time.perf_counter(), None, ""
        async with client.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                if choices and choices[0].get("text"):
                    first = first or time.perf_counter()
                    text += choices[0]["text"]
        c.answers.append(text)
        c.turns.append(None)  # type: ignore[arg-type]  # only counted: the next turn re-sends the answers
        rows.append((turn, c.index, sent - t0, ((first or sent) - sent) * 1000, (time.perf_counter() - sent) * 1000))

    async with httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for i in range(2):  # warm-up, sharing no text with the replay
            await client.post(url + "/v1/completions", json={**cfg.body(), "stream": False, "max_tokens": 4,
                                                             "prompt": f"warm up {i}"}, timeout=60)
        t0 = time.perf_counter()
        for turn in range(cfg.turns):
            waiting = iter(convs)  # shared: each worker takes the next session

            async def worker(waiting: Iterator[Conversation], turn: int) -> None:
                for c in waiting:
                    await one(client, c, turn, t0)

            await asyncio.gather(*(worker(waiting, turn) for _ in range(conc)))
    for turn, conv, sent, ttft, e2e in sorted(rows, key=lambda r: r[2]):
        print(f"turn {turn + 1} session {conv} sent at {sent:7.3f} s  TTFT {ttft:5.0f} ms  end to end {e2e:5.0f} ms")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2))
