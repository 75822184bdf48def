"""``llamafleet rpc-server``: lend this host's GPUs (or its CPU) to a llamafleet on another host that splits one model
over several hosts (``rpc_servers`` there), through llama.cpp's RPC backend.

It runs llama.cpp's own RPC server from the llama.cpp llamafleet is installed with (the same code as llama.cpp's
``rpc-server`` tool; client and server must speak the same protocol version, which one build guarantees). Bound to
127.0.0.1 unless ``--host`` says otherwise, with a loud warning then: the protocol is not secure.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from llamafleet.rpc import DEFAULT_PORT, INSECURE, is_loopback

DESCRIPTION = f"""Serve this host's devices to one llamafleet on another host (its config lists this host:port under
rpc_servers, with rpc_trusted_network: true). Every GPU of this host is offered, or the CPU when it has none.
One client at a time: give each llamafleet replica its own rpc-server.

WARNING: {INSECURE}. Bind it to an address on that private network only (never 0.0.0.0 on a host with a public
interface), or keep the default 127.0.0.1 and reach it through an SSH tunnel."""

BANNER = "!" * 100


def run(args: argparse.Namespace) -> int:
    if not is_loopback(args.host):
        print(f"\n{BANNER}\nWARNING: rpc-server listens on {args.host}, not 127.0.0.1.\n{INSECURE}.\n{BANNER}\n",
              file=sys.stderr, flush=True)
    from llamafleet.engine import llama_backend
    from llamafleet.paths import cache_dir

    llama_backend.init_backend("info")
    cache = None
    if args.cache:
        cache = cache_dir() / "rpc"
        cache.mkdir(parents=True, exist_ok=True)
    endpoint = f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}"
    for sig in (signal.SIGINT, signal.SIGTERM):  # llama.cpp's loop never returns to Python: die at once
        signal.signal(sig, signal.SIG_DFL)
    try:
        llama_backend.serve_rpc(endpoint, args.threads or os.cpu_count() or 1, str(cache) if cache else None)
    except RuntimeError as e:  # a llama.cpp built without the RPC backend
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"error: llama.cpp's RPC server could not start on {endpoint} (see above): is {args.host} an address of "
          f"this host, and port {args.port} free?", file=sys.stderr)
    return 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rpc-server", help="lend this host's GPUs (or CPU) to a llamafleet on another host "
                       "(llama.cpp's RPC backend; trusted networks only)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; anything else "
                   "exposes this host's memory to whoever can reach it)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    p.add_argument("--threads", type=int, default=None, help="CPU threads when serving the CPU (default: every core)")
    p.add_argument("--cache", action="store_true", help="keep tensors sent by clients in the cache folder "
                   "($LLAMAFLEET_CACHE/rpc), so the next load of the same model skips sending them again")
    p.set_defaults(func=run)
