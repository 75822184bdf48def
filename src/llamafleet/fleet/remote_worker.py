"""The worker process of a remote member: relays its sequences to an upstream server over HTTP, speaking the same
pipe protocol as a llama.cpp worker (see :mod:`llamafleet.fleet.remote` for why it is a process of its own).

* **Loading** is probing: ``GET /v1/models`` (the key is accepted, the model is served; unset ``model`` takes the
  first listed), then ``GET /ready`` (llamafleet) or ``GET /health`` (llama-server), where they exist, must not
  answer 5xx (loading). Then :class:`~llamafleet.fleet.messages.Ready`, with the member's ``max_concurrency`` as its
  slots; else :class:`~llamafleet.fleet.messages.LoadFailed` with why (the replica set shows it as the replica's
  last error and tries again with backoff: that is how an unreachable upstream is re-probed).
* **Serving**: each ``Submit`` becomes one streamed request (:mod:`llamafleet.fleet.relay`) on one connection pool
  (keep-alive, at most ``max_concurrency`` streams; more wait here, counted as waiting). Every chunk is sent back as
  soon as it arrives, as a ``StepOutputs`` (chunks that arrive together travel together). ``Abort`` closes the
  stream (the upstream sees its client leave). A request the upstream refuses or fails ends with the status
  :func:`~llamafleet.fleet.relay.upstream_failure` gives; one whose connection breaks ends with 503, a silence past
  ``timeout_s`` with 504.
* **Health**: the upstream is probed again every :data:`HEALTH_S`, and at once after a broken connection or a 5xx.
  A failed probe ends every relayed request with 503 (naming the member and why) and ends the process: the replica
  set sees the replica go down, routes nothing to it, and restarts it (probes again) with backoff.
* Heartbeats, as a llama.cpp worker's, come from the event loop that relays, whenever it sent nothing for ``beat_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from typing import Any

import httpx

from llamafleet.engine.types import EngineStats, RequestOutput
from llamafleet.fleet.messages import (
    Abort,
    FromWorker,
    Heartbeat,
    LoadFailed,
    Ready,
    Rejected,
    Shutdown,
    StepOutputs,
    Submit,
    ToWorker,
)
from llamafleet.fleet.pipe import WorkerPipe
from llamafleet.fleet.relay import RemoteMember, StreamReader, UpstreamError, upstream_failure, upstream_request
from llamafleet.openai_wire import bearer, error_text

log = logging.getLogger(__name__)

HEALTH_S = 5.0  # a ready member's upstream is probed this often
PROBE_PATHS = ("/ready", "/health")  # readiness where the upstream has it (llamafleet, llama-server); 404 elsewhere
DOWN_EXIT = 3  # the exit code of a member whose upstream stopped answering


class Unhealthy(Exception):
    """The upstream cannot serve now; the message says why, for operators (``last_error`` in ``/ready``)."""


async def probe(client: httpx.AsyncClient, member: RemoteMember) -> str:
    """Check that ``member`` can serve now; returns the upstream's name of the model (:class:`Unhealthy` if not)."""
    label = member.label
    try:
        r = await client.get("/v1/models")
        if r.status_code in (401, 403):
            raise Unhealthy(f"{label} refused this server's credentials (GET /v1/models answered {r.status_code}: "
                            f"{error_text(r.content)}); check the member's api_key_env / api_key_file")
        if r.status_code != 200:
            raise Unhealthy(f"{label}: GET /v1/models answered {r.status_code}: {error_text(r.content)}")
        data = r.json().get("data") or []
        served = [str(m.get("id")) for m in data if isinstance(m, dict)]
        if member.model is not None and member.model not in served:
            raise Unhealthy(f"{label} does not serve model '{member.model}' (it serves: {', '.join(served)}); set "
                            "the member's model to one of them")
        if not served:
            raise Unhealthy(f"{label} lists no model in GET /v1/models")
        for path in PROBE_PATHS:
            r = await client.get(path)
            if r.status_code >= 500:
                raise Unhealthy(f"{label} is not ready (GET {path} answered {r.status_code}: "
                                f"{error_text(r.content)})")
            if r.status_code != 404:
                break
    except httpx.HTTPError as e:
        raise Unhealthy(f"{label} is unreachable ({type(e).__name__}: {e or 'no answer'})") from None
    except ValueError as e:  # not JSON, or not the shape of a model list
        raise Unhealthy(f"{label}: GET /v1/models is not an OpenAI model list ({e})") from None
    return member.model or served[0]


class _Relays:
    """The relayed sequences of one member, their outputs on the way back to the API process, and its health."""

    def __init__(self, pipe: WorkerPipe, member: RemoteMember, client: httpx.AsyncClient, model: str) -> None:
        self.pipe, self.member, self.client, self.model = pipe, member, client, model
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.gate = asyncio.Semaphore(member.max_concurrency)
        self.outputs: list[RequestOutput] = []
        self.rejected: list[Rejected] = []
        self.pieces: dict[str, list[bytes]] = {}  # the tokens' bytes of outputs that carry logprobs
        self.flushing = False
        self.sent_at = time.monotonic()
        self.running = 0
        self.prompt_tokens = self.generated_tokens = 0
        self.down: str | None = None  # why the upstream is taken for gone: relays still running end with it
        self.recheck = asyncio.Event()

    # -- the way back ---------------------------------------------------------------------------------------------
    def send(self, msg: FromWorker) -> None:
        with contextlib.suppress(OSError):  # the API process is gone: the pipe's reader ends this worker
            self.pipe.send(msg)
        self.sent_at = time.monotonic()

    def emit(self, out: RequestOutput | Rejected, pieces: list[bytes] | None = None) -> None:
        if isinstance(out, Rejected):
            self.rejected.append(out)
        else:
            if out.request_id in self.pieces:
                self.flush()  # pieces go by request id: one output of a sequence per message (as per engine step)
            if pieces is not None:
                self.pieces[out.request_id] = pieces
            self.outputs.append(out)
        if not self.flushing:  # everything emitted in this turn of the event loop travels in one message
            self.flushing = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flushing = False
        if self.outputs or self.rejected:
            stats = EngineStats(slots_total=self.member.max_concurrency, slots_busy=self.running,
                                waiting=len(self.tasks) - self.running, kv_tokens_used=0, kv_tokens_total=0, steps=0,
                                prompt_tokens_total=self.prompt_tokens, generated_tokens_total=self.generated_tokens,
                                decode_seconds_total=0.0, step_seconds_total=0.0, sample_seconds_total=0.0)
            msg = StepOutputs(outputs=self.outputs, rejected=self.rejected, pieces=self.pieces, stats=stats)
            self.outputs, self.rejected, self.pieces = [], [], {}
            self.send(msg)

    async def beat(self, beat_s: float) -> None:
        while True:
            await asyncio.sleep(beat_s / 2)
            if time.monotonic() - self.sent_at >= beat_s:
                self.send(Heartbeat())

    # -- relaying -------------------------------------------------------------------------------------------------
    def submit(self, msg: Submit) -> None:
        if self.down is not None:
            self.emit(Rejected(msg.request_id, f"{self.down}; retry", 503))
            return
        self.tasks[msg.request_id] = asyncio.get_running_loop().create_task(self.relay(msg))

    def abort(self, request_id: str) -> None:
        task = self.tasks.get(request_id)
        if task is not None:
            task.cancel()

    async def relay(self, msg: Submit) -> None:
        rid = msg.request_id
        try:
            async with self.gate:
                self.running += 1
                try:
                    self.emit(await self.stream(msg))
                finally:
                    self.running -= 1
        except asyncio.CancelledError:  # aborted by the API process, or the upstream is gone
            self.emit(RequestOutput(rid, finished=True, finish_reason="cancelled") if self.down is None
                      else Rejected(rid, f"{self.down}, while relaying this request; retry it", 503))
        except Exception as e:  # a bug here must fail this request alone
            log.exception("relaying %s failed", rid)
            self.emit(Rejected(rid, f"{self.member.label}: relaying failed ({type(e).__name__}: {e})", 500))
        finally:
            self.tasks.pop(rid, None)

    async def stream(self, msg: Submit) -> RequestOutput | Rejected:
        """Relay ``msg``, emitting its outputs as they come; its last output, or why it failed."""
        rid, label = msg.request_id, self.member.label
        path, body = upstream_request(msg, self.member, self.model)
        reader = StreamReader(rid, msg.params.logprobs)
        try:
            async with self.client.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    if r.status_code >= 500 or r.status_code in (401, 403):
                        self.recheck.set()
                    status, text = upstream_failure(r.status_code, await r.aread(), label)
                    return Rejected(rid, text, status)
                async for line in r.aiter_lines():
                    out = reader.line(line)
                    if out is not None:
                        self.emit(out[0], out[1] if reader.logprobs else None)
                    if reader.done:
                        break
        except httpx.TimeoutException:
            return Rejected(rid, f"{label} sent nothing for {self.member.timeout_s:g}s (the member's timeout_s)",
                            504)
        except httpx.HTTPError as e:
            self.recheck.set()
            return Rejected(rid, f"{label}: the connection broke ({type(e).__name__}: {e or 'no answer'}); retry "
                                 "the request", 503)
        except UpstreamError as e:
            return Rejected(rid, f"{label} failed while answering: {e}", 502)
        if reader.finish is None:
            self.recheck.set()
            return Rejected(rid, f"{label} ended its answer without a finish reason; retry the request", 502)
        last = reader.last()
        self.prompt_tokens += last.prompt_tokens
        self.generated_tokens += last.completion_tokens
        return last

    async def watch(self, inbox: asyncio.Queue[ToWorker | Unhealthy]) -> None:
        """Probe the upstream every :data:`HEALTH_S` (at once when a relay asks); put the first failure in ``inbox``."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.recheck.wait(), HEALTH_S)
            self.recheck.clear()
            try:
                await probe(self.client, self.member)
            except Unhealthy as e:
                inbox.put_nowait(e)
                return

    async def end(self, why: str | None) -> None:
        """Stop every relay (``why``: the upstream is gone, they fail with it) and send what they report."""
        self.down = why
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.flush()


def _pump(pipe: WorkerPipe, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue[ToWorker | Unhealthy]) -> None:
    """The pipe's reader thread: the API process's messages into the event loop's inbox."""
    try:
        while True:
            loop.call_soon_threadsafe(inbox.put_nowait, pipe.recv())  # type: ignore[arg-type]
    except (EOFError, OSError):
        loop.call_soon_threadsafe(inbox.put_nowait, Shutdown())  # nobody is left to read results: stop
    except RuntimeError:
        pass  # the event loop has closed: the worker is exiting


async def _serve(pipe: WorkerPipe, member: RemoteMember, n_ctx_per_seq: int, beat_s: float) -> int:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[ToWorker | Unhealthy] = asyncio.Queue()
    threading.Thread(target=_pump, args=(pipe, loop, inbox), name="inbox", daemon=True).start()
    limits = httpx.Limits(max_connections=member.max_concurrency + 1, max_keepalive_connections=member.max_concurrency)
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=member.url, headers=bearer(member.api_key), timeout=member.timeout_s,
                                 limits=limits) as client:
        try:
            model = await probe(client, member)
        except Unhealthy as e:
            log.error("%s", e)
            pipe.send(LoadFailed(str(e)))
            return 1
        relays = _Relays(pipe, member, client, model)
        pipe.send(Ready(pid=os.getpid(), n_seq=member.max_concurrency, n_ctx_per_seq=n_ctx_per_seq,
                       load_seconds=time.monotonic() - t0))
        log.info("%s serves model '%s'", member.label, model)
        background: list[asyncio.Task[Any]] = [loop.create_task(relays.beat(beat_s)),
                                                 loop.create_task(relays.watch(inbox))]
        try:
            while True:
                msg = await inbox.get()
                if isinstance(msg, Submit):
                    relays.submit(msg)
                elif isinstance(msg, Abort):
                    relays.abort(msg.request_id)
                elif isinstance(msg, Unhealthy):
                    log.error("%s; this member goes down and is probed again by its restarts", msg)
                    await relays.end(str(msg))
                    return DOWN_EXIT
                else:  # Shutdown
                    await relays.end(None)
                    return 0
        finally:
            for task in background:
                task.cancel()


def remote_main(sock: socket.socket, replica: int, env: dict[str, str], member: RemoteMember, n_ctx_per_seq: int,
                log_level: str, beat_s: float) -> None:
    """Entry point of a remote member's process (the target of ``multiprocessing`` spawn, like
    :func:`~llamafleet.fleet.worker.worker_main`); its slots are the member's ``max_concurrency``, and
    ``n_ctx_per_seq`` is the context it reports."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)
    logging.basicConfig(level=log_level.upper(), datefmt="%H:%M:%S",
                        format=f"%(asctime)s %(levelname)s replica {replica} %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request would drown the server's log
    pipe = WorkerPipe(sock)
    try:
        code = asyncio.run(_serve(pipe, member, n_ctx_per_seq, beat_s))
    except OSError:
        log.warning("the server went away; replica %d exits", replica)
        code = 0
    finally:
        pipe.close()
    raise SystemExit(code)
