"""The pipe between the API process and one worker: pickled messages in length-prefixed frames over a socket pair.

A message may be far bigger than the kernel's socket buffer (a few hundred KB of prompt or stop strings, a big step's
logprobs), so neither side may assume one write or one read moves a whole message:

* every frame is an 8-byte big-endian payload length, then the pickled message (:func:`encode`); a
  :class:`FrameReader` takes bytes in whatever pieces they arrive and gives back each message once it is whole;
* the API process's end (:class:`AsyncPipe`) is an asyncio protocol: writes go through the transport, which buffers
  what the socket cannot take now and sends it, in order, when the socket drains, so a big message never blocks or
  fails on the event loop (uvloop puts the socket in non-blocking mode, where a full buffer is ``EAGAIN``);
  ``EAGAIN`` is the transport's business and never reaches the replica set; only end-of-file or a real error
  (``ECONNRESET``) closes the pipe, and that is how a dead worker is noticed at once;
* the worker's end (:class:`WorkerPipe`) uses plain blocking calls on the worker's own threads.

The message types themselves are in :mod:`llamafleet.fleet.messages`.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from typing import cast

HEADER = struct.Struct("!Q")  # payload length
READ_CHUNK = 1 << 16


def encode(msg: object) -> bytes:
    """One frame holding ``msg``."""
    payload = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


class FrameReader:
    """Turns a byte stream, in pieces of any size, back into the messages that were framed into it."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[object]:
        """Add ``data``; return every message now complete, in order (the rest waits for more bytes)."""
        self._buf += data
        msgs: list[object] = []
        while len(self._buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf)
            end = HEADER.size + size
            if len(self._buf) < end:
                break
            msgs.append(pickle.loads(self._buf[HEADER.size:end]))
            del self._buf[:end]
        return msgs


class WorkerPipe:
    """The worker's end: blocking sends (from any thread, one frame at a time) and blocking receives (one thread)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self._sock = sock
        self._reader = FrameReader()
        self._received: deque[object] = deque()
        self._send_lock = threading.Lock()  # frames from two threads must not interleave

    def send(self, msg: object) -> None:
        """Send ``msg`` whole; ``OSError`` (e.g. ``BrokenPipeError``) when the API process is gone."""
        frame = encode(msg)
        with self._send_lock:
            self._sock.sendall(frame)

    def recv(self) -> object:
        """The next message, waiting for it; ``EOFError`` once the API process has closed its end."""
        while not self._received:
            data = self._sock.recv(READ_CHUNK)
            if not data:
                raise EOFError("the API process closed the pipe")
            self._received.extend(self._reader.feed(data))
        return self._received.popleft()

    def close(self) -> None:
        self._sock.close()


class AsyncPipe(asyncio.Protocol):
    """The API process's end: messages are handed to ``on_message`` as they complete, sends never block.

    ``on_closed`` is called once, with why, when the pipe ends: end-of-file (the worker exited or was killed), a
    real socket error, a message that cannot be read, or :meth:`close`.
    """

    def __init__(self, on_message: Callable[[object], None], on_closed: Callable[[str], None]) -> None:
        self._on_message = on_message
        self._on_closed = on_closed
        self._reader = FrameReader()
        self._transport: asyncio.Transport | None = None
        self._unsent: list[bytes] = []  # sent before the transport exists
        self._closed = False

    async def open(self, sock: socket.socket) -> None:
        """Start watching ``sock`` (a connected stream socket, Unix or TCP, owned by the pipe from now on)."""
        loop = asyncio.get_running_loop()
        if sock.family == socket.AF_UNIX:
            await loop.create_unix_connection(lambda: self, sock=sock)
        else:  # a worker on another host (see fleet/ray_workers.py); asyncio turns Nagle's delay off on TCP
            await loop.create_connection(lambda: self, sock=sock)

    def send(self, msg: object) -> None:
        """Queue ``msg`` for the worker, in order; what the socket cannot take now is sent when it drains."""
        if self._closed:
            return
        if self._transport is None:
            self._unsent.append(encode(msg))
        else:
            self._transport.write(encode(msg))

    def close(self) -> None:
        """Drop the connection now (unsent data is discarded); ``on_closed`` is not called for it."""
        self._closed = True
        if self._transport is not None:
            self._transport.abort()

    # -- asyncio.Protocol ---------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        if self._closed:  # closed while it was being opened
            self._transport.abort()
            return
        self._transport.writelines(self._unsent)
        self._unsent.clear()

    def data_received(self, data: bytes) -> None:
        try:
            msgs = self._reader.feed(data)
        except Exception as e:  # a frame that does not unpickle: the other end is not speaking this protocol
            self._end(f"it sent a message that cannot be read ({type(e).__name__}: {e})")
            return
        for msg in msgs:
            if self._closed:  # a message handled just now closed the pipe
                return
            self._on_message(msg)

    def eof_received(self) -> bool:
        self._end("its end of the pipe closed")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end("its end of the pipe closed" if exc is None else f"its pipe broke ({exc})")

    def _end(self, why: str) -> None:
        if self._closed:
            return
        self.close()
        self._on_closed(why)
