"""A lean HTTP/1.1 client for streamed POST responses: the load generator's transport.

The benchmark must not be the bottleneck it measures. A general client (httpx over httpcore, h11 and anyio) spent
about 300 microseconds of CPU per server-sent event on the project's 2-core machine, so one client process topped
out near 3,000 events/s, under what one H200 generates at 128 streams. This client does only what a benchmark
needs, over asyncio's streams: one keep-alive connection per worker, ``POST`` with a JSON body, the status line and
headers, and a body framed by ``Transfer-Encoding: chunked``, ``Content-Length`` or the end of the connection,
handed out line by line. ``http`` and ``https`` URLs; no proxies, redirects or compression (a benchmark asks for
none of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit


class StreamClientError(Exception):
    """The connection failed or the server broke the HTTP framing."""


class _Stale(Exception):
    """A connection ended before any byte of the answer came back."""


@dataclass(frozen=True)
class Origin:
    """Where requests go: ``scheme://host:port`` and the path prefix every request path is joined to."""

    host: str
    port: int
    tls: bool
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        return cls(parts.hostname, parts.port or (443 if tls else 80), tls, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.tls else 80) else f"{host}:{self.port}"


class Response:
    """One response: ``status``, lower-cased ``headers``, and the body via :meth:`lines` or :meth:`read`."""

    def __init__(self, conn: Connection, status: int, headers: dict[str, str], keep_alive: bool) -> None:
        self.status = status
        self.headers = headers
        self._conn = conn
        self._keep_alive = keep_alive

    async def _pieces(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._framed():
                yield piece
        except StreamClientError:
            await self._conn.close()
            raise
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            await self._conn.close()
            raise StreamClientError(f"{type(e).__name__} while reading the body: {e}") from None
        self._conn.reusable = self._keep_alive  # read to its end: the connection can carry the next request

    async def _framed(self) -> AsyncIterator[bytes]:
        reader = self._conn.reader
        assert reader is not None
        if self.status in (204, 304) or 100 <= self.status < 200:
            return  # never a body, whatever the headers say (RFC 9112, 6.3)
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await reader.readline()
                try:
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise StreamClientError(f"bad chunk size line {size_line[:40]!r}") from None
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await reader.read(min(left, 1 << 16))
                if not data:
                    raise StreamClientError("the connection closed before the end of the body")
                left -= len(data)
                yield data
        else:  # delimited by the end of the connection
            self._keep_alive = False
            while data := await reader.read(1 << 16):
                yield data

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines, without their ``\\n`` or ``\\r\\n`` (server-sent events come one field per line)."""
        rest = b""
        async for piece in self._pieces():
            rest += piece
            if b"\n" not in piece:
                continue
            *done, rest = rest.split(b"\n")
            for line in done:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if rest:
            yield rest.rstrip(b"\r").decode("utf-8", "replace")

    async def read(self) -> bytes:
        return b"".join([p async for p in self._pieces()])


class Connection:
    """One keep-alive HTTP/1.1 connection to ``origin``, opened on first use and again after any failure."""

    def __init__(self, origin: Origin, connect_timeout: float = 30.0) -> None:
        self.origin = origin
        self.connect_timeout = connect_timeout
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.reusable = False

    async def _open(self) -> None:
        o = self.origin
        ctx = ssl.create_default_context() if o.tls else None
        try:
            async with asyncio.timeout(self.connect_timeout):
                self.reader, self.writer = await asyncio.open_connection(o.host, o.port, ssl=ctx,
                                                                         limit=1 << 20)
        except TimeoutError:
            raise StreamClientError(f"connecting to {o.host}:{o.port} timed out") from None
        except OSError as e:
            raise StreamClientError(f"cannot connect to {o.host}:{o.port}: {e.strerror or e}") from None

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> Response:
        """Send ``POST path`` with a JSON ``body``; returns once the status line and headers are in. The connection
        is reused for the next request only if this response's body was read to its end. A kept-alive connection
        that the server closed while idle (it answers nothing) is replaced and the request sent once more."""
        head = [f"POST {self.origin.prefix}{path} HTTP/1.1", f"Host: {self.origin.host_header}",
                "Content-Type: application/json", "Accept: text/event-stream", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        reused = self.writer is not None and self.reusable
        if not reused:
            await self.close()
            await self._open()
        try:
            return await self._exchange(request)
        except _Stale:
            await self.close()
            if not reused:
                raise StreamClientError("the server closed the connection without answering") from None
        await self._open()
        try:
            return await self._exchange(request)
        except _Stale:
            await self.close()
            raise StreamClientError("the server closed the connection without answering") from None

    async def _exchange(self, request: bytes) -> Response:
        assert self.reader is not None and self.writer is not None
        self.reusable = False  # until this response is read to its end
        try:
            self.writer.write(request)
            await self.writer.drain()
            status_line = await self.reader.readline()
        except (ConnectionResetError, BrokenPipeError):
            raise _Stale from None
        except OSError as e:
            await self.close()
            raise StreamClientError(f"{type(e).__name__}: {e}") from None
        if not status_line:
            raise _Stale
        try:
            parts = status_line.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                raise StreamClientError(f"not an HTTP/1.x response: {status_line[:80]!r}")
            status = int(parts[1])
            fields: dict[str, str] = {}
            while (line := await self.reader.readline()) not in (b"\r\n", b"\n"):
                if not line:
                    raise StreamClientError("the connection closed inside the response headers")
                name, _, value = line.decode("latin-1").partition(":")
                fields[name.strip().lower()] = value.strip()
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            await self.close()
            raise StreamClientError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
        except StreamClientError:
            await self.close()
            raise
        keep = fields.get("connection", "").lower() != "close" and not parts[0].startswith(b"HTTP/1.0")
        return Response(self, status, fields, keep)

    async def close(self) -> None:
        w, self.reader, self.writer = self.writer, None, None
        if w is not None:
            w.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await w.wait_closed()
