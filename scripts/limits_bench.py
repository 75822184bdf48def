"""What a key's limits cost per request: the checks alone, and the whole key gate beside a gate with no keys.

    python scripts/limits_bench.py [--tenants 200] [--requests 20000] [--json OUT]

A keys file of ``--tenants`` tenants, each with all four limits (high enough never to refuse), is loaded as the
server loads it. Measured per request: (1) the admission checks alone: the key found by its digest, its scope, the
limits (concurrent, tokens per day, tokens per minute, requests per minute) and the release; (2) one token charge
(usage and buckets), which runs once per output a request streams; (3) the ASGI gate
(``llamafleet.api.middleware.Gate``) in front of an app that answers nothing, called directly (no HTTP), with that
keys file and with no keys at all, interleaved round by round: the difference is what the tenants add.
The numbers are in docs/BENCHMARKS.md ("Tenants").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from starlette.types import Message, Receive, Scope, Send

from llamafleet.api.middleware import Gate, presented_key, scope_of
from llamafleet.fleet.telemetry import FleetMetrics
from llamafleet.tenants.keys import KeyRing, load_keyring
from llamafleet.tenants.tenancy import Tenancy

LIMITS = "{requests_per_minute: 100000000, tokens_per_minute: 100000000, tokens_per_day: 1000000000, concurrent: 64}"


def keys_file(folder: Path, n: int) -> Path:
    path = folder / "keys.yaml"
    path.write_text("keys:\n" + "".join(f"  - {{name: t{i}, key: k-{i}, limits: {LIMITS}}}\n" for i in range(n)),
                    encoding="utf-8")
    return path


def scope_for(key: str) -> Scope:
    return {"type": "http", "method": "POST", "path": "/v1/chat/completions",
            "headers": [(b"authorization", f"Bearer {key}".encode()), (b"content-length", b"2")]}


def checks_alone(tenancy: Tenancy, n_tenants: int, requests: int) -> tuple[float, float]:
    """Seconds per request of the admission checks (key, scope, limits, release), and of one token charge."""
    scopes = [scope_for(f"k-{i % n_tenants}") for i in range(requests)]
    t0 = time.perf_counter()
    for scope in scopes:
        tenant = tenancy.ring.identify(presented_key(scope))
        assert tenant is not None and scope_of(scope["path"]) in tenant.scopes
        assert tenancy.admit(tenant) is None
        tenancy.limiter.release(tenant)
    t1 = time.perf_counter()
    meters = [tenancy.meter(t) for t in tenancy.ring.tenants.values()]
    t2 = time.perf_counter()
    for i in range(requests):
        meters[i % n_tenants](0, 0, 1)  # one output's token, as the dispatcher reports each step
    return (t1 - t0) / requests, (time.perf_counter() - t2) / requests


async def _nothing(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()


async def _receive() -> Message:
    return {"type": "http.request", "body": b"{}", "more_body": False}


async def _send(message: Message) -> None:
    return None


async def gate_round(gate: Gate, scopes: list[Scope]) -> tuple[float, float]:
    """Seconds per request through ``gate``: wall time, and this process's CPU time (what a busy machine's waits for
    a core do not inflate)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for scope in scopes:
        await gate(dict(scope), _receive, _send)
    return (time.perf_counter() - t0) / len(scopes), (time.process_time() - c0) / len(scopes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tenants", type=int, default=200)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the numbers here too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        ring = load_keyring(str(keys_file(Path(folder), args.tenants)), environ={})
        ring = KeyRing(ring.tenants, ring.open, ring.cached_token_weight)  # no usage file: nothing written
    tenancy = Tenancy(ring, FleetMetrics())
    checks, charges = zip(*(checks_alone(tenancy, args.tenants, args.requests) for _ in range(args.rounds)),
                          strict=True)
    keyed = Gate(_nothing, tenancy, 1 << 20)
    open_gate = Gate(_nothing, Tenancy(KeyRing(), FleetMetrics()), 1 << 20)
    scopes = [scope_for(f"k-{i % args.tenants}") for i in range(args.requests)]
    with_keys, without = [], []
    for _ in range(args.rounds):  # interleaved, so that a busy machine weighs on both alike
        with_keys.append(asyncio.run(gate_round(keyed, scopes)))
        without.append(asyncio.run(gate_round(open_gate, scopes)))
    added = [(w[0] - o[0], w[1] - o[1]) for w, o in zip(with_keys, without, strict=True)]
    result = {"tenants": args.tenants, "requests_per_round": args.requests, "rounds": args.rounds,
              "load_1min": os.getloadavg()[0], "cpus": os.cpu_count(),
              "admission_checks_us_per_request": [round(c * 1e6, 2) for c in checks],
              "token_charge_us_per_output": [round(c * 1e6, 2) for c in charges],
              "gate_with_tenants_us": [round(c[0] * 1e6, 2) for c in with_keys],
              "gate_without_keys_us": [round(c[0] * 1e6, 2) for c in without],
              "gate_with_tenants_cpu_us": [round(c[1] * 1e6, 2) for c in with_keys],
              "gate_without_keys_cpu_us": [round(c[1] * 1e6, 2) for c in without],
              "added_by_tenants_us_median": round(statistics.median(a[0] for a in added) * 1e6, 2),
              "added_by_tenants_cpu_us_median": round(statistics.median(a[1] for a in added) * 1e6, 2)}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
