"""Ask each RPC server (``rpc_servers``) what devices it has and how much memory they have free, at plan time.

The API process never loads llama.cpp, so the question is asked by a child process through the engine's bindings
(as ``check-env`` probes llama.cpp); it connects, reads each device's free and total memory (llama.cpp's RPC device
asks the server), prints one marked JSON line and exits, which closes the connection before any replica opens its
own. Each endpoint is first checked with a plain TCP connect (:func:`llamafleet.rpc.check_reachable`, also the round
trip the plan quotes), because llama.cpp aborts the process on an endpoint that does not answer.

An RPC server serves one client at a time: a server already used by a running replica accepts the connection but
does not answer, which the child's timeout turns into an error that says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

from llamafleet.placement.gpus import Inventory, InventoryError, RemoteDevice
from llamafleet.rpc import RpcUnreachable, check_reachable

PROBE_MARK = "llamafleet-rpc-probe:"
PROBE_TIMEOUT_S = 30.0


class RpcProbeError(InventoryError):
    """An RPC server that could not be asked, worded with the endpoint and the fix (the inventory is incomplete)."""


def with_rpc(inventory: Inventory, endpoints: list[str]) -> Inventory:
    """``inventory`` plus the devices of ``endpoints`` (unchanged when there are none)."""
    return replace(inventory, rpc=probe(endpoints)) if endpoints else inventory


def probe(endpoints: list[str]) -> tuple[RemoteDevice, ...]:
    """Every device of every endpoint, in order, with its memory and the endpoint's round trip."""
    try:
        rtt = {e: min(check_reachable(e) for _ in range(3)) * 1000 for e in endpoints}  # the first pays for setup
    except RpcUnreachable as e:
        raise RpcProbeError(str(e)) from None
    cmd = [sys.executable, "-c", "from llamafleet.placement.rpc_probe import child; child()", *endpoints]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # a client only: this host's GPUs are not needed to ask
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise RpcProbeError(f"the RPC servers {', '.join(endpoints)} accepted a connection but did not answer within "
                            f"{PROBE_TIMEOUT_S:g} s: an RPC server serves one client at a time, so another process "
                            "(a running llamafleet?) may be using one; stop it or start another rpc-server") from None
    found = [line[len(PROBE_MARK):] for line in proc.stdout.splitlines() if line.startswith(PROBE_MARK)]
    if proc.returncode != 0 or not found:
        said = [line for line in proc.stderr.splitlines() if line.strip()]
        raise RpcProbeError(f"asking the RPC servers {', '.join(endpoints)} for their devices failed (exit "
                            f"{proc.returncode}): {said[-1] if said else 'no output'}")
    return tuple(RemoteDevice(d["endpoint"], d["device"], d["total"] >> 20, d["free"] >> 20, rtt[d["endpoint"]])
                 for d in json.loads(found[-1]))


def child() -> None:
    """Child-process entry: print each endpoint's devices with their memory as one marked JSON line."""
    from llamafleet.engine import llama_backend

    llama_backend.init_backend("error")
    out = []
    for endpoint in sys.argv[1:]:
        for i, dev in enumerate(llama_backend.rpc_devices(endpoint)):
            free, total = llama_backend.device_memory(dev)
            out.append({"endpoint": endpoint, "device": i, "free": free, "total": total})
    print(PROBE_MARK + json.dumps(out), flush=True)
