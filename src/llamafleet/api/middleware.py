"""Every ASGI layer a request passes before a route sees it: :class:`HttpMetrics` (outermost: counts and times every
answer), :class:`InternalErrors` (a crash becomes a 500 with an error id), :class:`Gate` (API keys, their scopes and
limits, request body limits), then :class:`HeadAsGet` (HEAD answered as GET without the body).

Keys are the tenants of :mod:`llamafleet.tenants` (``LLAMAFLEET_API_KEYS``, ``api_keys_file`` as a plain list or in
the tenants form, and the admin keys); with no API key anywhere, authentication is off outside ``/admin/``. Clients
send ``Authorization: Bearer <key>`` (OpenAI's SDKs) or ``x-api-key: <key>`` (Anthropic's); a missing or wrong key
gets 401 with the error body of the route's dialect. ``/health`` and
``/ready`` stay open for probes (``/ready`` shows its details only to callers with a key, see :func:`authenticated`),
and so do the dashboard's static files under ``/ui`` (the page asks for the key and sends it with every call to
``/v1/status`` and the API, which stay closed).

Each route needs a scope (:func:`scope_of`): ``/admin/``, ``/v1/usage`` and vLLM's LoRA loading routes ``admin``,
``/metrics`` ``metrics``, ``/v1/embeddings`` ``embeddings``, everything else ``inference``; a key without it gets 403
(a plain key on an admin route: 401, as before tenants). Admin keys (``LLAMAFLEET_ADMIN_API_KEYS``,
``admin_api_keys_file``) have every scope.
Without any key with the ``admin`` scope, the admin routes answer 403.

A POST outside the admin routes by a key with limits takes its place in the key's limits here (429 with
``Retry-After``, naming the limit, see :mod:`llamafleet.tenants.limits`) and gives it back when its answer is over.
The recognised tenant is left in ``scope["state"]`` for the routes (:func:`tenant_of`).

Bodies larger than ``max_body_bytes`` get 413, whether announced by ``Content-Length`` or streamed chunked; the body
is read here (bounded) and handed on whole, so nothing downstream ever holds more than the limit.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llamafleet.api.errors import ApiError, error_response, internal_error, is_anthropic
from llamafleet.api.protocol import SSE_DONE, Event, sse, sse_event
from llamafleet.api.recent import RecentRequests
from llamafleet.fleet.telemetry import FleetMetrics
from llamafleet.tenants.keys import ADMIN_KEYS_ENV, Tenant
from llamafleet.tenants.keys import Scope as KeyScope
from llamafleet.tenants.tenancy import Tenancy

ADMIN_PREFIX = "/admin/"
ADMIN_PATHS = frozenset({"/v1/usage", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"})  # (vLLM's)
OPEN_PATHS = frozenset({"/health", "/ready", "/ui"})
OPEN_PREFIX = "/ui/"  # the dashboard's files: the same bytes as in the package; its data needs a key
DRAIN_FACTOR = 16  # an oversize body is read (and dropped) up to this many times the limit, so the client sees 413
AUTHENTICATED = "llamafleet.authenticated"  # scope["state"] key: the request to an open path carried a valid key
TENANT = "llamafleet.tenant"  # scope["state"] key: the tenant whose key the request carried


def presented_key(scope: Scope) -> bytes:
    """The API key a request carries (``Authorization: Bearer`` first, then ``x-api-key``); empty if none."""
    headers: dict[bytes, bytes] = dict(scope["headers"])
    scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        token = headers.get(b"x-api-key", b"")
    return token.strip()


# The encoder's routes: embeddings and rerank (a reranker's score is an embedding pass with a classifier head).
ENCODER_PATHS = frozenset({"/v1/embeddings", "/v1/rerank", "/rerank", "/v1/reranking", "/reranking"})


def scope_of(path: str) -> KeyScope:
    """The scope a key needs for ``path``."""
    if path.startswith(ADMIN_PREFIX) or path in ADMIN_PATHS:
        return "admin"
    if path == "/metrics":
        return "metrics"
    return "embeddings" if path in ENCODER_PATHS else "inference"


class Gate:
    """ASGI middleware: API key check (when keys are set), the key's scope and limits, then the body size limit."""

    def __init__(self, app: ASGIApp, tenancy: Tenancy, max_body_bytes: int) -> None:
        self.app = app
        self.tenancy = tenancy
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        needs = scope_of(path)
        tenant, refusal = self._check_key(scope, needs)
        state = scope.setdefault("state", {})
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIX):
            state[AUTHENTICATED] = refusal is None
            tenant, refusal = None, None
        work = refusal is None and tenant is not None and scope["method"] == "POST" and needs != "admin"
        limited = work and tenant is not None and tenant.limited
        if limited:
            assert tenant is not None
            over = self.tenancy.admit(tenant)
            if over is not None:
                limited = False
                refusal = ApiError(429, f"rate limit reached: {over.message}", code="rate_limit_exceeded",
                                   param=over.limit, headers={"Retry-After": str(over.retry_after_s)})
        elif work and tenant is not None:
            self.tenancy.usage.admitted(tenant.name)
        try:
            if refusal is None:
                state[TENANT] = tenant
                body = await self._read_body(scope, receive)
                if isinstance(body, ApiError):
                    refusal = body
                else:
                    await self.app(scope, _replay(body, receive), send)
                    return
            await error_response(refusal, path)(scope, receive, send)
        finally:
            if limited:
                assert tenant is not None
                self.tenancy.limiter.release(tenant)

    def _check_key(self, scope: Scope, needs: KeyScope) -> tuple[Tenant | None, ApiError | None]:
        """The tenant of the request's key (None: authentication is off), or the 401/403 that refuses it."""
        ring = self.tenancy.ring
        admin = needs == "admin"
        if admin and not ring.has_admin:
            return None, ApiError(403, "the admin routes need an admin API key, and none is set: set "
                                       f"admin_api_keys_file or {ADMIN_KEYS_ENV}, or give a key the 'admin' scope",
                                  code="admin_disabled")
        if ring.open and not admin:
            return None, None
        token = presented_key(scope)
        if not token:
            return None, ApiError(401, "missing API key: send it as 'Authorization: Bearer <key>' or "
                                       "'x-api-key: <key>'", code="invalid_api_key",
                                  headers={"WWW-Authenticate": "Bearer"})
        tenant = ring.identify(token)
        if tenant is None or (admin and tenant.plain and needs not in tenant.scopes):
            what = "invalid admin API key" if admin else "invalid API key"
            return None, ApiError(401, what, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        if needs not in tenant.scopes:
            self.tenancy.usage.refusal(tenant.name, "scope")
            return None, ApiError(403, f"the key '{tenant.name}' may not use {scope['path']}: it lacks the "
                                       f"'{needs}' scope (its scopes: {', '.join(sorted(tenant.scopes))})",
                                  code="insufficient_scope", param=needs)
        return tenant, None

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | ApiError:
        """The whole request body, or the 413/400 that refuses it."""
        limit = self.max_body_bytes
        too_big = ApiError(413, f"the request body is larger than the server's limit of {limit} bytes "
                                "(max_body_bytes)")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit():
                return ApiError(400, f"invalid Content-Length header {length[:40]!r}")
            if int(length) > limit * DRAIN_FACTOR:
                return too_big  # not read at all: the connection is closed after the answer
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left, or body_timeout_s ran out: never run half a body
                return ApiError(408, "the request body did not arrive in full")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)
            elif size > limit * DRAIN_FACTOR:
                return too_big
            more = message.get("more_body", False)
        return too_big if size > limit else b"".join(chunks)


def tenant_of(scope: Scope) -> Tenant | None:
    """The tenant whose key the request carried (None: authentication is off, or an open path)."""
    tenant: Tenant | None = scope.get("state", {}).get(TENANT)
    return tenant


def authenticated(scope: Scope) -> bool:
    """Whether a request to an open path (``/ready``) came with a valid key; always true when authentication is off."""
    return bool(scope.get("state", {}).get(AUTHENTICATED, True))


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands out ``body`` once, then whatever the client sends next (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def route_label(scope: Scope) -> str:
    """The route template a request matched (``/v1/models/{model_id:path}``), or ``other`` (unknown paths, and
    requests refused before routing), so that random paths cannot multiply the metric's series."""
    return str(getattr(scope.get("route"), "path", "other"))


class HeadAsGet:
    """ASGI middleware (the innermost): a HEAD request is answered as the GET of the same path, without its body, as
    HTTP asks; uptime monitors and load balancers send HEAD, and FastAPI's routes take only the methods they name.
    The layers outside still see HEAD (metrics count it as such)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        inner = {**scope, "method": "GET"}

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.start" and "route" in inner:
                scope["route"] = inner["route"]  # for the metrics' route label
            elif message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app(inner, receive, headers_only)


class InternalErrors:
    """ASGI middleware: an exception escaping a route becomes a 500 whose body says only an error id; the log line
    with the traceback carries the same id (see :func:`~llamafleet.api.protocol.internal_error`). A stream that
    breaks after it started ends with an error event and ``data: [DONE]``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started: Message | None = None

        async def send_and_watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = message
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        except Exception as exc:
            error = internal_error(f"{scope['method']} {scope['path']!r} raised", exc)
            if started is None:
                await error_response(error, scope["path"])(scope, receive, send)
            elif any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in started["headers"]):
                end = (sse_event(Event.model_validate(error.anthropic_body())) if is_anthropic(scope["path"])
                       else sse(error.body()) + SSE_DONE)
                await send({"type": "http.response.body", "body": end.encode(), "more_body": False})
            else:
                raise  # a whole body was being written: the server closes the connection


class HttpMetrics:
    """ASGI middleware (the outermost): counts every answer by route and status, and times it to its last byte; with
    ``recent``, lists it there too (see :mod:`llamafleet.api.recent`)."""

    def __init__(self, app: ASGIApp, metrics: FleetMetrics, recent: RecentRequests | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.recent = recent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 0
        counted = False
        recent = self.recent
        entry = recent.begin(scope) if recent else None

        def count() -> None:
            nonlocal counted
            if not counted:  # at the last byte, or when the app ends without one (a client that left mid-stream)
                counted = True
                route = route_label(scope)  # known once the app has routed the request
                elapsed = time.perf_counter() - t0
                self.metrics.http_requests.inc(route, scope["method"], str(status or 500))
                self.metrics.http_seconds.observe(elapsed, route)
                if recent and entry:
                    recent.end(entry, route, status or 500, elapsed)

        async def send_and_count(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            if recent and entry:
                recent.sent(entry, message)
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                count()

        if recent and entry:
            receive = recent.watch_receive(entry, receive)
        try:
            await self.app(scope, receive, send_and_count)
        finally:
            count()
