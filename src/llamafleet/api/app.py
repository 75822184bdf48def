"""The API process: the FastAPI app (routes, OpenAI error bodies, ``/health``, ``/ready``, ``/metrics``) and its life.

Every request passes, outermost first: :class:`~llamafleet.api.middleware.HttpMetrics` (counts and times every
answer), :class:`~llamafleet.api.middleware.InternalErrors` (a crash becomes a 500 with an error id), CORS (only when
``cors_origins`` is set), :class:`~llamafleet.api.middleware.Gate` (API keys, body size limit),
:class:`~llamafleet.api.middleware.HeadAsGet` (HEAD on every GET route), then the routes.
Below them all, each connection is a :class:`~llamafleet.api.http_limits.GuardedHttp` (head size, read and write
timeouts). The :class:`~llamafleet.fleet.watchdog.Watchdog` and the dashboard's sampler
(:class:`~llamafleet.api.status.Dashboard`) run alongside while the server is up.

:func:`run_server` serves on an already bound socket while the replicas load in the background (``/ready`` says 503
until every replica is up; requests are served as soon as one is). On SIGINT/SIGTERM it stops accepting and gives
in-flight requests ``drain_timeout_s`` to finish; those still running then end with a 503 (a stream: an error event
and ``data: [DONE]``), logged in one line; a second signal does the same at once. Connections still open
:data:`CUT_S` later are closed. Then it tells every worker to exit, waits up to :data:`WORKER_EXIT_S` for them, and
returns 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from llamafleet import __version__
from llamafleet.api import (
    adapters,
    admin,
    anthropic,
    embeddings,
    generate,
    infill,
    openai,
    props,
    rerank,
    responses,
    status,
    tokens,
    ui,
    usage,
)
from llamafleet.api.errors import ApiError, error_response
from llamafleet.api.http_limits import GuardedHttp, HttpLimits, guarded_http
from llamafleet.api.middleware import Gate, HeadAsGet, HttpMetrics, InternalErrors, authenticated
from llamafleet.api.params import nearest_param
from llamafleet.api.service import Service, ServiceDep
from llamafleet.fleet.launch import LoadError
from llamafleet.fleet.metrics import CONTENT_TYPE
from llamafleet.fleet.snapshot import FleetSnapshot, publish

log = logging.getLogger(__name__)

CUT_S = 3.0  # after the drain, ended requests get this long to write their last bytes before connections are cut
WORKER_EXIT_S = 10.0  # then workers get this long to cancel their work and exit before they are killed
SHUTTING_DOWN = "the server is shutting down; retry the request"


def _is_type_tag(part: object) -> bool:
    """Whether a location part names a union member (``str``, ``list[str]``, ``TextPart``) rather than a field."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part or part[:1].isupper())


def validation_error(errors: list[dict[str, Any]], body: Any = None) -> ApiError:
    """One clear 400 from pydantic's errors: the parameter, what is wrong, what was sent; with ``body`` (the route's
    request model), the nearest known parameter for an unknown one."""
    first = errors[0]
    loc = [p for p in first["loc"] if p != "body"] if first["loc"][:1] == ("body",) else list(first["loc"])
    kind = first["type"]
    if kind == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return ApiError(400, f"the request body is not valid JSON ({detail})".replace(" ()", ""))
    if not loc:
        return ApiError(400, "the request body must be a JSON object of parameters, sent with "
                             "Content-Type: application/json")
    msgs = [first["msg"]]
    # A union (e.g. str | list[str]) reports one error per member, each with the member's name as the last loc.
    alternatives = [e for e in errors[1:] if tuple(e["loc"])[:-1] == tuple(first["loc"])[:-1]]
    if alternatives and _is_type_tag(loc[-1]):
        loc = loc[:-1]
        msgs += [e["msg"] for e in alternatives]
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    if kind == "missing":
        return ApiError(400, f"missing required parameter '{param}'", param=param)
    if kind == "extra_forbidden":
        near = nearest_param(body, loc) if body is not None else None
        hint = f": did you mean '{near}'?" if near else ""
        return ApiError(400, f"unknown or unsupported parameter '{param}'{hint}", param=param)
    sent = repr(first.get("input"))
    sent = sent if len(sent) <= 80 else sent[:77] + "..."
    reason = ", or ".join(dict.fromkeys(m.removeprefix("Value error, ") for m in msgs))
    return ApiError(400, f"invalid '{param}': {reason} (got {sent})", param=param)


def _replica_report(snap: FleetSnapshot, detail: bool) -> list[dict[str, Any]]:
    """Each replica as a load balancer needs it; with ``detail`` (an operator), also pids, loads and last errors.
    With several models, each loaded model's replicas, their index prefixed by the model ("chat/0")."""
    report = []
    for m in snap.models:
        for r in m.replicas:
            replica: dict[str, Any] = {"index": r.id if m.prefix else r.index, "where": r.where, "status": r.status,
                                       "suspect": r.suspect, "restarts": r.restarts, "slots": r.slots,
                                       "slots_busy": r.slots_busy}
            if detail:
                replica |= {"pid": r.pid, "load_fraction": r.load_fraction, "outstanding": r.outstanding,
                            "generated_tokens": r.generated_tokens, "last_error": r.last_error}
            report.append(replica)
    return report


def create_app(service: Service, on_ready: Callable[[], None], on_fatal: Callable[[str], None]) -> FastAPI:
    """The app. Loading starts with the app's lifespan; ``on_ready`` / ``on_fatal`` report how the first load went."""

    async def load() -> None:
        try:
            await service.models.start()
        except LoadError as e:
            on_fatal(str(e))
            return
        service.loaded = True
        on_ready()

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(load())
        watching = asyncio.create_task(service.watchdog.run())
        keys = asyncio.create_task(service.tenancy.watch())
        sampling = asyncio.create_task(dashboard.run())
        yield
        loading.cancel()
        watching.cancel()
        keys.cancel()
        sampling.cancel()
        await service.models.stop(WORKER_EXIT_S)

    app = FastAPI(title="llamafleet", version=__version__, lifespan=lifespan)
    app.state.service = service
    dashboard = app.state.dashboard = status.Dashboard(service)
    app.include_router(openai.routes)
    app.include_router(anthropic.routes)
    app.include_router(responses.routes)
    app.include_router(generate.routes)
    app.include_router(admin.routes)
    app.include_router(adapters.routes)
    app.include_router(embeddings.routes)
    app.include_router(tokens.routes)
    app.include_router(props.routes)
    app.include_router(infill.routes)
    app.include_router(rerank.routes)
    app.include_router(status.routes)
    app.include_router(usage.routes)
    app.include_router(ui.routes)
    cfg = service.config
    app.add_middleware(HeadAsGet)
    app.add_middleware(Gate, tenancy=service.tenancy, max_body_bytes=cfg.max_body_bytes)
    if cfg.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=cfg.cors_origins, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"])
    app.add_middleware(InternalErrors)
    app.add_middleware(HttpMetrics, metrics=service.metrics, recent=dashboard.recent)

    @app.exception_handler(ApiError)
    async def api_error(r: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc, r.url.path)

    @app.exception_handler(RequestValidationError)
    async def invalid(r: Request, exc: RequestValidationError) -> JSONResponse:
        body = getattr(getattr(r.scope.get("route"), "body_field", None), "field_info", None)
        return error_response(validation_error(list(exc.errors()), getattr(body, "annotation", None)), r.url.path)

    @app.exception_handler(HTTPException)
    async def http_error(r: Request, exc: HTTPException) -> JSONResponse:
        what = f"no route {r.method} {r.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return error_response(ApiError(exc.status_code, what), r.url.path)

    @app.get("/health")
    async def health() -> dict[str, str]:
        """The process is alive (for liveness probes)."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready(request: Request, svc: ServiceDep) -> JSONResponse:
        """200 once every replica has loaded, while at least one serves; 503 while loading, overloaded, or none serve.

        A replica that dies later shows as "degraded" with 200: taking the whole endpoint out of a load balancer
        because one of several GPUs restarts would turn a partial outage into a full one. With API keys on, a caller
        without a valid key sees what a load balancer needs (no pids, error texts or why the server is overloaded).
        """
        detail = authenticated(request.scope)
        snap = svc.snapshot()
        state = snap.readiness(svc.loaded)
        ok = state in ("ready", "degraded")
        body = {"status": state, "model": svc.model_name, "replicas": _replica_report(snap, detail)}
        if snap.overloaded is not None and detail:
            body["overloaded"] = snap.overloaded
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics(svc: ServiceDep) -> Response:
        """Prometheus text format; see docs/OPERATIONS.md for what each metric means."""
        publish(svc.snapshot(), svc.metrics)
        return Response(svc.metrics.registry.render(), media_type=CONTENT_TYPE)

    return app


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, except that a signal that stopped it cleanly is not raised again afterwards (exit 0), and
    that the requests still running when ``drain_s`` ends, or at a second signal, end with a 503 error (a stream: an
    error event, then ``data: [DONE]``) instead of having their tasks cancelled mid-write, which cut streams short
    and printed tracebacks. Connections still open :data:`CUT_S` later are closed. A third signal forces the exit."""

    def __init__(self, config: uvicorn.Config, drain_s: float, end_all: Callable[[str], int]) -> None:
        super().__init__(config)
        self._drain_s = drain_s
        self._end_all = end_all  # ends every running sequence with a 503 of this message; returns how many
        self._hurried = False

    def handle_exit(self, sig: int, frame: Any) -> None:
        loop = asyncio.get_running_loop()
        if self.should_exit and not self._hurried:
            self._hurried = True
            message = "the server is stopping now (a second stop signal); retry the request"
            loop.call_soon_threadsafe(lambda: log.warning(
                "%s again: ending %d running sequence(s) now (a third stop signal forces the exit)",
                signal.Signals(sig).name, self._end_all(message)))
            return
        if not self.should_exit:  # the first signal: say once what happens now, and what another one does
            busy = sum(c.busy for c in self._connections())
            loop.call_soon_threadsafe(lambda: log.log(
                logging.WARNING if busy else logging.INFO, "%s: stopping; %s", signal.Signals(sig).name,
                f"{busy} running request(s) get up to {self._drain_s:g}s (drain_timeout_s) to finish; a second Ctrl-C "
                "or SIGTERM ends them now with a 503" if busy else "no request is running"))
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        timers = [loop.call_later(self._drain_s, self._end_drain), loop.call_later(self._drain_s + CUT_S, self._cut)]
        try:
            await super().shutdown(sockets)
        finally:
            for timer in timers:
                timer.cancel()

    def _connections(self) -> list[GuardedHttp]:
        return [c for c in self.server_state.connections if isinstance(c, GuardedHttp)]

    def _end_drain(self) -> None:
        requests = sum(c.busy for c in self._connections())
        sequences = self._end_all(SHUTTING_DOWN)
        if requests or sequences:
            log.warning("drain ended after %gs (drain_timeout_s): %d request(s) still running, %d sequence(s) of "
                        "them ended with a 503 error (a stream: an error event, then [DONE])", self._drain_s,
                        requests, sequences)

    def _cut(self) -> None:
        connections = self._connections()
        if connections:
            log.warning("closing %d connection(s) still open %gs after the drain", len(connections), CUT_S)
        for c in connections:
            c.cut()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        original = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in original.items():
                signal.signal(s, handler)


class _OwnStopWords(logging.Filter):
    """uvicorn's "(CTRL+C to force quit)" is not what a second Ctrl-C does here (it ends the running requests; see
    :class:`_Uvicorn`): those words are left out of its lines, and the server's own line says what happens."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = record.msg.replace(" (CTRL+C to force quit)", "").replace(" (Press CTRL+C to quit)", "")
        return True


def run_server(service: Service, sock: socket.socket, log_level: str, on_ready: Callable[[], None]) -> int:
    """Serve on ``sock`` until a signal (0) or until the first load fails (1)."""
    rc = 0

    def fatal(message: str) -> None:
        nonlocal rc
        log.error("%s", message)
        rc = 1
        server.should_exit = True

    app = create_app(service, on_ready, fatal)
    cfg = service.config
    config = uvicorn.Config(app, log_config=None, log_level=log_level, access_log=log_level == "debug",
                            http=guarded_http(HttpLimits.of(cfg)), ws="none", lifespan="on",
                            # the last resort, should ending the requests and cutting connections not be enough
                            timeout_graceful_shutdown=math.ceil(cfg.drain_timeout_s + CUT_S) + 1)
    server = _Uvicorn(config, cfg.drain_timeout_s, service.models.abort_all)
    words = _OwnStopWords()
    logging.getLogger("uvicorn.error").addFilter(words)
    try:
        server.run(sockets=[sock])
    finally:
        logging.getLogger("uvicorn.error").removeFilter(words)
    return rc
