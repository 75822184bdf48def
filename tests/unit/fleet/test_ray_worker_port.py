"""The port replicas on other hosts connect back to (fleet/ray_workers.py's ``WorkerListener``): a connection is
handed to a launch only after it sent that launch's token, each token works once, and anything else is closed
without a byte of it being unpickled."""

from __future__ import annotations

import asyncio
import socket

from llamafleet.fleet.pipe import encode
from llamafleet.fleet.ray_workers import TOKEN_BYTES, WorkerListener


async def _closed_by_server(port: int, sent: bytes) -> bool:
    """Whether the server closes a connection that sent ``sent`` (end of file, or a reset for unread bytes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(sent)
    writer.write_eof()
    try:
        await writer.drain()
        got = await asyncio.wait_for(reader.read(1), 15)
    except ConnectionResetError:
        return True
    finally:
        writer.close()
    return got == b""


def test_ray_worker_port_takes_only_an_expected_token_and_only_once() -> None:
    async def scenario() -> None:
        listener = WorkerListener("127.0.0.1", 0)
        try:
            token, connected = listener.expect()
            # a stranger: a wrong token, then a pickled frame that would run code if it were read
            assert await _closed_by_server(listener.port, bytes(TOKEN_BYTES) + encode(print))
            assert await _closed_by_server(listener.port, token[:-1])  # short, then end of file
            assert not connected.done()
            worker = socket.create_connection(("127.0.0.1", listener.port))
            worker.sendall(token)
            conn = await asyncio.wait_for(connected, 15)
            assert conn.getpeername() == worker.getsockname()
            assert await _closed_by_server(listener.port, token)  # used once: a replay is refused
            conn.close()
            worker.close()
        finally:
            listener.close()

    asyncio.run(scenario())
