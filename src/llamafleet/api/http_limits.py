"""Limits on what one HTTP connection may cost the server, enforced where bytes meet the HTTP parser.

uvicorn's httptools protocol buffers a request head of any size (an 8 MB header was accepted and held in memory,
before the API key was looked at), waits forever for a head or a body that trickles in, and waits forever to write
to a client that stopped reading. :class:`GuardedHttp` is that protocol with four bounds, all FleetConfig keys:

* ``max_header_bytes``: a head (request line and headers) past it gets 431 and the connection is closed; at most one
  read (up to 256 KiB) is fed to the parser beyond the limit, so memory never grows with what the client sends;
* ``header_timeout_s``: a head must be complete this long after its connection opened (or, on a kept-alive
  connection, after its first byte); otherwise 408 (or a silent close if nothing came at all);
* ``body_timeout_s``: a body must be complete this long after its head; otherwise 408 (the request is not run);
* ``write_timeout_s``: a connection whose answer cannot be written for this long (the client reads nothing, so the
  socket's buffers stay full) is closed, which ends its request like a client that left.

Refusals are written straight to the socket with OpenAI's error body, then the connection lingers for
:data:`LINGER_S` dropping what still arrives, so the client reads the answer instead of a connection reset.
It also mends one gap of uvicorn's: a lost connection is reported to every pipelined request on it, not only the
newest (the one being answered went on writing to the closed socket and raised).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from llamafleet.api.errors import ApiError
from llamafleet.config import FleetConfig

log = logging.getLogger(__name__)

LINGER_S = 2.0  # after a refusal, input is read and dropped this long before the connection is closed


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    write_timeout_s: float

    @classmethod
    def of(cls, cfg: FleetConfig) -> HttpLimits:
        return cls(cfg.max_header_bytes, cfg.header_timeout_s, cfg.body_timeout_s, cfg.write_timeout_s)


def guarded_http(limits: HttpLimits) -> type[GuardedHttp]:
    """The protocol class to give uvicorn (``Config(http=...)``), bound to ``limits``."""
    return type("GuardedHttp", (GuardedHttp,), {"limits": limits})


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of the module docstring (one instance per connection)."""

    limits: ClassVar[HttpLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the parser is (or will next be) reading a request head
        self._head_bytes = 0  # bytes fed to the parser for the current head
        self._heads = 0  # heads parsed on this connection
        self._deadline: asyncio.TimerHandle | None = None  # head or body deadline, then the lingering close
        self._write_stall: asyncio.TimerHandle | None = None
        self._refused = False  # an error was written; whatever still arrives is dropped
        self._answering: RequestResponseCycle | None = None  # the request being answered (pipelined: not self.cycle)

    # -- connection -----------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s, self._head_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._unstall()
        # uvicorn tells only the newest request (``self.cycle``) that the client left; with pipelined requests the
        # one being answered is older, and it went on writing to the closed transport (a RuntimeError traceback)
        for cycle in [self._answering, *(c for c, _app in self.pipeline)]:
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed the parser, at most what is left of ``max_header_bytes`` while a head is being read: a head still
        incomplete after that is refused. (A head that starts in the same read as the end of the request before it
        is counted from the next read on, so it may exceed the limit by one read before it is refused.)"""
        while data and not self._refused and not self.transport.is_closing():
            if not self._in_head:
                super().data_received(data)
                return
            room = self.limits.max_header_bytes - self._head_bytes
            piece, data = data[:room], data[room:]
            heads = self._heads
            self._head_bytes += len(piece)
            if piece:
                super().data_received(piece)
            if data and self._in_head and self._heads == heads:
                self._refuse(431, f"the request head (request line and headers) is larger than the server's limit of "
                                  f"{self.limits.max_header_bytes} bytes (max_header_bytes); send smaller headers")

    @property
    def busy(self) -> bool:
        """A request is being answered on this connection."""
        return self.cycle is not None and not self.cycle.response_complete

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self._answering = cycle
        super()._start_asgi_task(cycle, app)

    def cut(self) -> None:
        """Close the connection at once, whatever it is doing (the last step of a shutdown)."""
        self.transport.abort()

    # -- parser callbacks -----------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # a kept-alive connection's next request: its head starts now
            self._arm(self.limits.header_timeout_s, self._head_too_slow)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads += 1
        self._arm(self.limits.body_timeout_s, self._body_too_slow)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        self._head_bytes = 0
        super().on_message_complete()

    # -- writing --------------------------------------------------------------------------------------------------
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_stall is None:
            self._write_stall = self.loop.call_later(self.limits.write_timeout_s, self._write_stalled)

    def resume_writing(self) -> None:
        self._unstall()
        super().resume_writing()

    def _unstall(self) -> None:
        if self._write_stall is not None:
            self._write_stall.cancel()
            self._write_stall = None

    def _write_stalled(self) -> None:
        self._write_stall = None
        log.info("closing the connection of %s: it read nothing of its answer for %gs (write_timeout_s)",
                 _peer(self.client), self.limits.write_timeout_s)
        self.transport.abort()  # close() would wait for the unread buffer to be flushed: forever

    # -- deadlines and refusals -----------------------------------------------------------------------------------
    def _arm(self, seconds: float, callback: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_too_slow(self) -> None:
        self._deadline = None
        if self._head_bytes == 0:
            self.transport.close()  # an idle connection that never sent a request: nobody to answer
            return
        self._refuse(408, f"the request head did not arrive within {self.limits.header_timeout_s:g}s "
                          "(header_timeout_s)")

    def _body_too_slow(self) -> None:
        self._deadline = None
        self._refuse(408, f"the request body did not arrive within {self.limits.body_timeout_s:g}s of its head "
                          "(body_timeout_s)")

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` unless an answer is under way, then close the connection after lingering."""
        self._refused = True
        self._disarm()
        log.info("refused a request from %s: %d, %s", _peer(self.client), status, message)
        cycle = self.cycle  # in a head: the previous request's, if any; in a body: this request's
        answer = True
        if cycle is not None and not cycle.response_complete:
            if self._in_head or cycle.response_started:  # an answer is being written: no room for another
                self.transport.abort()
                return
            cycle.disconnected = True  # the app (waiting for the body) sees the client leave: the request never runs
            cycle.message_event.set()
        elif cycle is not None and not self._in_head:
            answer = False  # this request was answered already (without its body, e.g. 401 or 413)
        if answer:
            body = ApiError(status, message).body().model_dump_json().encode()
            head = [STATUS_LINE[status]]
            head += [name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers]
            head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
                     b"connection: close\r\n\r\n"]
            self.transport.write(b"".join(head) + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self._deadline = self.loop.call_later(LINGER_S, self.transport.abort)


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"
