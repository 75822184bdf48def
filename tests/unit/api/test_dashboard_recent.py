"""The recent-requests list behind the dashboard: what the HTTP middleware records of each request, and what it keeps
of the contents only when the operator turns that on. Driven through the real middleware with httpx's ASGI client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from llamafleet.api.errors import ApiError, error_response
from llamafleet.api.middleware import Gate, HttpMetrics
from llamafleet.api.recent import CONTENT_BYTES, KEEP_REQUESTS, RecentRequests, note_error, note_usage
from llamafleet.fleet.telemetry import FleetMetrics
from llamafleet.tenants.keys import KeyRing
from llamafleet.tenants.tenancy import Tenancy


def _app(recent: RecentRequests) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> JSONResponse:
        note_usage(11, 7, 4)
        return JSONResponse({"answer": "secret answer " * 300}, headers={"x-llamafleet-replicas": "1,0"})

    @app.post("/v1/stream")
    async def stream() -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            yield "data: one\n\n"
            note_usage(3, 2, 0)  # inside the body's task: the same request's entry
            note_error("the replica went away")
            yield "data: two\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/v1/messages/x")
    async def refused() -> JSONResponse:
        return error_response(ApiError(429, "slow down"), "/v1/messages/x")  # Anthropic's error body

    @app.get("/ready")
    async def ready() -> JSONResponse:
        return JSONResponse({"status": "loading"}, status_code=503)

    @app.get("/v1/status")
    async def status() -> dict[str, str]:
        return {}

    tenancy = Tenancy(KeyRing(), FleetMetrics())
    app.add_middleware(Gate, tenancy=tenancy, max_body_bytes=1 << 20)  # reads the body, as in the server
    app.add_middleware(HttpMetrics, metrics=FleetMetrics(), recent=recent)
    return app


async def _send(recent: RecentRequests, *requests: tuple[str, str, bytes]) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(recent)), base_url="http://t") as client:
        for method, path, body in requests:
            await client.request(method, path, content=body)


def test_each_request_is_listed_with_route_status_tokens_and_replicas_but_no_contents() -> None:
    recent = RecentRequests()
    asyncio.run(_send(recent, ("POST", "/v1/chat/completions", b'{"prompt": "secret question"}'),
                      ("GET", "/v1/status", b""), ("GET", "/ready", b""), ("GET", "/nowhere/secret", b"")))
    chat, unknown = recent.requests
    assert (chat.method, chat.route, chat.status, chat.replicas) == ("POST", "/v1/chat/completions", 200, "1,0")
    assert (chat.prompt_tokens, chat.completion_tokens, chat.cached_tokens) == (11, 7, 4) and chat.latency_s > 0
    assert chat.request_body is None and chat.response_body is None and chat.error is None
    assert "secret" not in str([e.to_json() for e in recent.requests]) + str(list(recent.errors))
    # the path a client typed is not kept, only the route it matched ("other")
    assert (unknown.route, unknown.status) == ("other", 404)
    assert [e["source"] for e in recent.errors] == ["GET other"]
    # the dashboard's own polling and the probes are not listed; a 503 from /ready is not an error


def test_errors_carry_the_message_the_client_got_even_inside_a_stream() -> None:
    recent = RecentRequests()
    asyncio.run(_send(recent, ("GET", "/v1/messages/x", b""), ("POST", "/v1/stream", b"")))
    refused, streamed = recent.requests
    assert (refused.status, refused.error) == (429, "slow down")
    assert (streamed.status, streamed.error, streamed.completion_tokens) == (200, "the replica went away", 2)
    assert [(e["status"], e["message"]) for e in recent.errors] == [(429, "slow down"),
                                                                    (200, "the replica went away")]


def test_contents_are_kept_only_when_turned_on_and_only_their_beginning() -> None:
    recent = RecentRequests(contents=True)
    question = b'{"prompt": "' + b"q" * 5000 + b'"}'
    asyncio.run(_send(recent, ("POST", "/v1/chat/completions", question), ("POST", "/v1/stream", b"")))
    chat, streamed = recent.requests
    assert chat.request_body == question[:CONTENT_BYTES].decode()
    assert chat.response_body is not None and chat.response_body.startswith('{"answer":"secret answer')
    assert len(chat.response_body) == CONTENT_BYTES
    assert streamed.response_body == "data: one\n\ndata: two\n\n"
    assert chat.to_json()["request_body"] == chat.request_body and "_body" not in chat.to_json()


def test_the_lists_are_bounded() -> None:
    recent = RecentRequests()
    asyncio.run(_send(recent, *[("GET", "/missing", b"")] * (KEEP_REQUESTS + 5)))
    assert len(recent.requests) == KEEP_REQUESTS and len(recent.errors) == recent.errors.maxlen
