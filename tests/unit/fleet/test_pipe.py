"""The pipe's framing over real socket pairs: messages many times the socket buffer, both ways, in pieces, with the
API end on asyncio's and on uvloop's event loop (uvloop makes the socket non-blocking, where a full buffer is EAGAIN).

The worker end runs on a thread with blocking calls, as in a worker process; the API end must never block its loop,
never lose or reorder a message, and report the pipe closed only for end-of-file or a real error.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from llamafleet.fleet.pipe import HEADER, AsyncPipe, FrameReader, WorkerPipe, encode

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop,
                                                             "uvloop": uvloop.new_event_loop}
BIG = 3 << 20  # 3 MiB: dozens of times a socket pair's buffer


def _run(loop_name: str, main: Coroutine[Any, Any, None]) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        runner.run(asyncio.wait_for(main, 60))


class _ApiEnd:
    """An :class:`AsyncPipe` and what it received / why it closed."""

    def __init__(self) -> None:
        self.received: list[object] = []
        self.closed: list[str] = []
        self.got = asyncio.Event()
        self.pipe = AsyncPipe(self._message, self._closed)
        self.fd = -1

    @classmethod
    async def connected(cls) -> tuple[_ApiEnd, socket.socket]:
        """An API end open on a fresh socket pair, and the pair's other end (the worker's)."""
        mine, peer = socket.socketpair()
        api = cls()
        api.fd = mine.fileno()
        await api.pipe.open(mine)
        return api, peer

    def _message(self, msg: object) -> None:
        self.received.append(msg)
        self.got.set()

    def _closed(self, why: str) -> None:
        self.closed.append(why)
        self.got.set()

    async def wait(self, until: Callable[[], bool]) -> None:
        while not until():
            self.got.clear()
            await self.got.wait()


def test_frames_come_back_whole_and_in_order_from_pieces_of_any_size() -> None:
    msgs: list[object] = [b"", "x" * 100_000, {"k": list(range(1000))}, None, ("small",)]
    stream = b"".join(encode(m) for m in msgs)
    for piece in (1, 7, 4096, len(stream)):
        reader, out = FrameReader(), []
        for at in range(0, len(stream), piece):
            out.extend(reader.feed(stream[at:at + piece]))
        assert out == msgs


def test_worker_ends_move_big_messages_both_ways_at_once() -> None:
    a, b = socket.socketpair()
    left, right = WorkerPipe(a), WorkerPipe(b)
    payload = os.urandom(BIG)
    got: dict[str, object] = {}

    def side(name: str, me: WorkerPipe) -> None:  # both send before either reads: a deadlock without a reader thread
        reader = threading.Thread(target=lambda: got.__setitem__(name, me.recv()))
        reader.start()
        me.send((name, payload))
        reader.join(30)

    threads = [threading.Thread(target=side, args=(n, p)) for n, p in (("left", left), ("right", right))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {"left": ("right", payload), "right": ("left", payload)}
    right.close()
    with pytest.raises(EOFError):
        left.recv()
    left.close()


@pytest.mark.parametrize("loop_name", LOOPS)
def test_api_end_sends_more_than_the_socket_holds_without_blocking_or_dying(loop_name: str) -> None:
    async def main() -> None:
        api, b = await _ApiEnd.connected()
        msgs = [(k, os.urandom(300_000)) for k in range(10)] + [("last", b"")]
        t0 = time.perf_counter()
        for m in msgs:
            api.pipe.send(m)  # nobody reads yet: the socket fills at once and the rest waits in the pipe's buffer
        assert time.perf_counter() - t0 < 1.0
        if loop_name == "uvloop":
            assert not os.get_blocking(api.fd)  # the case that once failed: writes past the buffer are EAGAIN

        worker, received = WorkerPipe(b), []

        def read_slowly() -> None:
            time.sleep(0.3)  # the event loop keeps running while the pipe is full
            while not received or received[-1] != ("last", b""):
                received.append(worker.recv())
                time.sleep(0.01)
            worker.send("done")

        reader = threading.Thread(target=read_slowly)
        reader.start()
        await asyncio.sleep(0.2)
        assert not api.closed and reader.is_alive()
        await api.wait(lambda: bool(api.received or api.closed))
        reader.join(30)
        assert received == msgs and api.received == ["done"] and not api.closed
        api.pipe.close()
        worker.close()

    _run(loop_name, main())


@pytest.mark.parametrize("loop_name", LOOPS)
def test_api_end_reads_a_message_that_arrives_in_pieces(loop_name: str) -> None:
    async def main() -> None:
        api, b = await _ApiEnd.connected()
        payload = os.urandom(BIG)
        frame = encode(("big", payload)) + encode("after")

        def trickle() -> None:  # pieces with pauses: the loop sees EAGAIN mid-message many times
            for at in range(0, len(frame), 200_000):
                b.sendall(frame[at:at + 200_000])
                time.sleep(0.01)

        writer = threading.Thread(target=trickle)
        writer.start()
        await api.wait(lambda: len(api.received) == 2 or bool(api.closed))
        writer.join(30)
        assert api.received == [("big", payload), "after"] and not api.closed

        b.close()  # end-of-file: the worker is gone, reported once
        await api.wait(lambda: bool(api.closed))
        await asyncio.sleep(0.05)
        assert api.closed == ["its end of the pipe closed"]
        api.pipe.send("to nobody")  # sending to a closed pipe is a no-op, not an error

    _run(loop_name, main())


@pytest.mark.parametrize("loop_name", LOOPS)
def test_api_end_reports_a_peer_gone_mid_message_or_speaking_garbage(loop_name: str) -> None:
    async def main() -> None:
        for data, why in ((encode("x" * 100_000)[:50_000], "its end of the pipe closed"),
                          (HEADER.pack(3) + b"\x80\xff\x00", "cannot be read")):
            api, b = await _ApiEnd.connected()
            b.sendall(data)
            b.close()
            await api.wait(lambda: bool(api.closed))  # noqa: B023 (awaited within the iteration)
            assert len(api.closed) == 1 and why in api.closed[0] and not api.received

    _run(loop_name, main())


def test_messages_sent_before_the_pipe_opens_go_first() -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        api = _ApiEnd()
        api.pipe.send("early")
        await api.pipe.open(a)
        api.pipe.send("late")
        worker = WorkerPipe(b)
        assert await asyncio.to_thread(lambda: [worker.recv(), worker.recv()]) == ["early", "late"]
        api.pipe.close()
        worker.close()

    _run("uvloop", main())


def test_encode_is_pickle_behind_a_length() -> None:
    frame = encode({"a": 1})
    (size,) = HEADER.unpack_from(frame)
    assert size == len(frame) - HEADER.size and pickle.loads(frame[HEADER.size:]) == {"a": 1}
