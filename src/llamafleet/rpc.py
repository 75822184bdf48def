"""llama.cpp RPC servers as seen from llamafleet: endpoint syntax, a reachability check, the security warning.

llama.cpp's RPC backend lets one process use the devices of another host (``llamafleet rpc-server`` there): the model
is split by layers over local and remote devices. Its protocol has no authentication and no encryption, and a client
can make the server read and write memory as it asks, so llama.cpp itself calls it insecure; llamafleet uses it only
behind the ``rpc_trusted_network: true`` opt-in, and binds ``rpc-server`` to 127.0.0.1 unless told otherwise.

The check exists because llama.cpp aborts the whole process (``GGML_ABORT``: "Failed to connect to ...") when an
endpoint does not answer; a plain TCP connect first turns that into an error that names the endpoint and the fix.
It shares the API process's, the probe's and the worker's code: this module imports nothing but the standard library.
"""

from __future__ import annotations

import socket
import time

DEFAULT_PORT = 50052  # llama.cpp's rpc-server default
CONNECT_TIMEOUT_S = 5.0

INSECURE = ("llama.cpp's RPC protocol has no authentication and no encryption, and a client can make the server "
            "read and write its memory: run rpc-server only on a trusted, private network, never reachable from "
            "anything else")


class RpcUnreachable(ConnectionError):
    """An RPC endpoint that does not accept a connection, worded with the endpoint and the fix."""


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) → (host, port); ``ValueError`` naming the expected form."""
    host, sep, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"'{text}' is not an RPC endpoint: write host:port, e.g. 10.0.0.2:{DEFAULT_PORT}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def check_reachable(endpoint: str, timeout_s: float = CONNECT_TIMEOUT_S) -> float:
    """Open and close one TCP connection to ``endpoint``; the seconds it took (about one round trip).

    Raises :class:`RpcUnreachable` naming the endpoint. The server handles one client at a time and takes the next
    connection when the current one ends; this one sends nothing, so the server just sees it close.
    """
    host, port = parse_endpoint(endpoint)
    t0 = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return time.perf_counter() - t0
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise RpcUnreachable(f"RPC server {endpoint} (config key rpc_servers) is unreachable: {why}; start "
                             f"`llamafleet rpc-server --host HOST --port {port}` on that host, or fix rpc_servers"
                             ) from None
