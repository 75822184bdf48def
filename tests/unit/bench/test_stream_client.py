"""The lean HTTP/1.1 client against real sockets: a scripted server on 127.0.0.1 writes exact raw bytes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from llamafleet.bench.client import Connection, Origin, StreamClientError


@dataclass
class Reply:
    """Raw bytes for one request, written piece by piece (drained, with a pause between); then maybe a close."""

    pieces: list[bytes]
    close: bool = False


@dataclass
class RawServer:
    """Answers the n-th request (over any connection) with ``replies[n]``; records the connections and requests."""

    replies: list[Reply]
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        await asyncio.wait_for(asyncio.gather(*self._tasks), 5)  # every handler saw its client close

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    break  # the client closed the connection
                length = next(int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                              if k.lower() == b"content-length")
                self.requests.append(head + await reader.readexactly(length))
                reply = self.replies.pop(0)
                for piece in reply.pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.005)
                if reply.close:
                    break
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def connect(server: RawServer, prefix: str = "") -> AsyncIterator[Connection]:
    conn = Connection(Origin.parse(f"http://127.0.0.1:{server.port}{prefix}"), connect_timeout=5)
    try:
        yield conn
    finally:
        await conn.close()


def length_reply(body: bytes, close: bool = False) -> Reply:
    return Reply([b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: text/plain\r\n\r\n%s" % (len(body), body)],
                 close)


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.mark.parametrize(("url", "origin", "host_header"), [
    ("http://example.com", Origin("example.com", 80, False, ""), "example.com"),
    ("https://example.com/", Origin("example.com", 443, True, ""), "example.com"),
    ("http://h:8/v1/", Origin("h", 8, False, "/v1"), "h:8"),
    ("https://h:8443/a/b", Origin("h", 8443, True, "/a/b"), "h:8443"),
    ("https://h:80", Origin("h", 80, True, ""), "h:80"),
    ("http://[::1]:8080/", Origin("::1", 8080, False, ""), "[::1]:8080"),
    ("http://[::1]", Origin("::1", 80, False, ""), "[::1]"),
])
def test_origin_parse(url: str, origin: Origin, host_header: str) -> None:
    assert Origin.parse(url) == origin
    assert Origin.parse(url).host_header == host_header


@pytest.mark.parametrize("url", ["ftp://x", "localhost:8080", "http://", "//h:80/"])
def test_origin_parse_rejects_non_http_urls(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        Origin.parse(url)


def test_chunked_sse_lines_split_at_awkward_places() -> None:
    pieces = [CHUNKED_HEAD, chunk(b"data: {\"a\""), chunk(b": 1}\r\n\r\ndata: x\r"), chunk(b"\n\r\ndata: "),
              chunk(b"caf\xc3"), chunk(b"\xa9\n\ndata: [DONE]\n\n"), b"0\r\n\r\n"]

    async def main() -> list[str]:
        async with RawServer([Reply(pieces)]) as srv, connect(srv) as conn:
            r = await conn.post("/s", b"{}")
            assert r.status == 200
            assert r.headers["content-type"] == "text/event-stream"
            return [line async for line in r.lines()]

    assert asyncio.run(main()) == ['data: {"a": 1}', "", "data: x", "", "data: café", "", "data: [DONE]", ""]


def test_chunked_extensions_trailers_and_a_last_line_without_newline() -> None:
    pieces = [CHUNKED_HEAD, b"5;ext=1\r\nab\ncd\r\n", b"2\r\nef\r\n", b"0\r\nX-Trailer: 1\r\n\r\n"]

    async def main() -> list[str]:
        async with RawServer([Reply(pieces)]) as srv, connect(srv) as conn:
            return [line async for line in (await conn.post("/", b"")).lines()]

    assert asyncio.run(main()) == ["ab", "cdef"]


def test_content_length_body() -> None:
    body = b'{"ok": true, "n": 12345}\n' * 5000  # larger than one socket read

    async def main() -> None:
        async with RawServer([length_reply(body), length_reply(b"")]) as srv, connect(srv) as conn:
            assert await (await conn.post("/", b"")).read() == body
            assert await (await conn.post("/", b"")).read() == b""

    asyncio.run(main())


def test_no_content_response_has_an_empty_body() -> None:
    async def main() -> None:
        async with RawServer([Reply([b"HTTP/1.1 204 No Content\r\n\r\n"])]) as srv, connect(srv) as conn:
            r = await conn.post("/", b"")
            assert r.status == 204
            assert await asyncio.wait_for(r.read(), 0.5) == b""

    asyncio.run(main())


@pytest.mark.parametrize(("first", "connections"), [
    (length_reply(b"one"), 1),
    (Reply([CHUNKED_HEAD, b"1;ext=x\r\no\r\n", chunk(b"ne"), b"0\r\nX-Checksum: 1\r\n\r\n"]), 1),
    (Reply([b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\none"]), 2),
    (Reply([b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\none"]), 2),
    (Reply([b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\no", b"n", b"e"], close=True), 2),  # to EOF
])
def test_keep_alive_reuse(first: Reply, connections: int) -> None:
    """The second request reuses the connection only if the first response's framing allows it."""

    async def main() -> None:
        async with RawServer([first, length_reply(b"two")]) as srv:
            async with connect(srv) as conn:
                assert await (await conn.post("/", b"")).read() == b"one"
                assert await (await conn.post("/", b"")).read() == b"two"
            assert srv.connections == connections
            assert len(srv.requests) == 2

    asyncio.run(main())


def test_stale_keep_alive_connection_is_retried_once() -> None:
    async def main() -> None:
        async with RawServer([length_reply(b"one", close=True), length_reply(b"two")]) as srv:
            async with connect(srv) as conn:
                assert await (await conn.post("/", b"1")).read() == b"one"
                await asyncio.sleep(0.05)  # the server's close reaches the idle connection
                r = await conn.post("/", b"2")
                assert r.status == 200
                assert await r.read() == b"two"
            assert srv.connections == 2
            assert [q[-1:] for q in srv.requests] == [b"1", b"2"]

    asyncio.run(main())


def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        srv = RawServer([], port=s.getsockname()[1])  # nothing listens there once the socket is closed

    async def main() -> None:
        async with connect(srv) as conn:
            with pytest.raises(StreamClientError, match=f"cannot connect to 127.0.0.1:{srv.port}"):
                await conn.post("/", b"")

    asyncio.run(main())


@pytest.mark.parametrize(("pieces", "message"), [
    ([b"SSH-2.0-OpenSSH_9.6\r\n"], r"not an HTTP/1.x response: b'SSH-2.0-OpenSSH_9.6\\r\\n'"),
    ([b"HTTP/1.1 OK\r\n\r\n"], "ValueError"),
    ([b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"], "closed inside the response headers"),
    ([], "closed the connection without answering"),
])
def test_broken_response_heads(pieces: list[bytes], message: str) -> None:
    async def main() -> None:
        async with RawServer([Reply(pieces, close=True)]) as srv, connect(srv) as conn:
            with pytest.raises(StreamClientError, match=message):
                await conn.post("/", b"")

    asyncio.run(main())


@pytest.mark.parametrize(("pieces", "message"), [
    ([CHUNKED_HEAD, chunk(b"data: a\n"), b"zz\r\n"], r"bad chunk size line b'zz\\r\\n'"),
    ([CHUNKED_HEAD, b"10\r\nshort"], "IncompleteReadError while reading the body"),
    ([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"], "closed before the end of the body"),
])
def test_broken_bodies(pieces: list[bytes], message: str) -> None:
    async def main() -> None:
        async with RawServer([Reply(pieces, close=True)]) as srv, connect(srv) as conn:
            r = await conn.post("/", b"")
            assert r.status == 200
            with pytest.raises(StreamClientError, match=message):
                await r.read()

    asyncio.run(main())


def test_request_bytes() -> None:
    body = '{"model": "m", "prompt": "é"}'.encode()

    async def main() -> RawServer:
        async with RawServer([length_reply(b"")]) as srv, connect(srv, "/v1/") as conn:
            r = await conn.post("/chat/completions", body, {"Authorization": "Bearer sk-1", "X-Trace": "7"})
            assert (r.status, await r.read()) == (200, b"")
            return srv

    srv = asyncio.run(main())
    head, _, sent = srv.requests[0].partition(b"\r\n\r\n")
    request_line, *lines = head.decode("latin-1").split("\r\n")
    assert request_line == "POST /v1/chat/completions HTTP/1.1"
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    assert headers["host"] == f"127.0.0.1:{srv.port}"
    assert headers["content-length"] == str(len(body)) != str(len(body.decode()))
    assert headers["authorization"] == "Bearer sk-1"
    assert headers["x-trace"] == "7"
    assert headers["content-type"] == "application/json"
    assert sent == body
