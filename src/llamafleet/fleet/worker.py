"""The worker process of one replica: owns one :class:`~llamafleet.engine.engine.Engine`, driven by one thread.

Started by :mod:`llamafleet.fleet.replicas` with multiprocessing's ``spawn``; :func:`worker_main` is the whole life of
the process. It sets the replica's environment (``CUDA_VISIBLE_DEVICES`` and friends) *before* llama.cpp is imported,
loads the engine while reporting progress, answers with :class:`~llamafleet.fleet.messages.Ready` (the readiness
handshake), then loops: take the commands that arrived, run one engine step, send that step's outputs of every sequence
as one :class:`~llamafleet.fleet.messages.StepOutputs`. A second thread only reads the pipe, so the API process can
always send while the engine decodes; the engine itself is touched by the main thread alone.

Liveness: the same loop sends a :class:`~llamafleet.fleet.messages.Heartbeat` whenever it has sent nothing for
``beat_s`` (idle, or a step that produced no output), so the API process hears from a working replica at least that
often. The beat comes from the engine's own thread on purpose: a worker stuck in one step (a wedged GPU call, a
deadlock) or frozen whole falls silent, and the API process kills it after ``heartbeat_timeout_s``. While a step
runs longer than ``beat_s``, a thread of its own sends a :class:`~llamafleet.fleet.messages.Pulse` instead: the
process is alive, so the replica is not suspect (:mod:`llamafleet.fleet.suspicion`), only a whole frozen process is.

The worker ends when told (:class:`~llamafleet.fleet.messages.Shutdown`: in-flight requests are cancelled and reported)
or when the API process disappears (its end of the pipe closes), so a killed server leaves no orphan workers.
Ctrl-C in a terminal reaches the whole process group; workers ignore SIGINT and let the server shut them down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import signal
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from llamafleet.engine.grammar import inside_think
from llamafleet.engine.types import (
    ContextOverflow,
    EmbeddingRequest,
    EmbeddingUnavailable,
    EngineConfig,
    Request,
    RequestOutput,
)
from llamafleet.fleet.messages import (
    Abort,
    FromWorker,
    Heartbeat,
    LoadFailed,
    LoadProgress,
    Pulse,
    Ready,
    Rejected,
    SetAdapters,
    Shutdown,
    StepOutputs,
    Submit,
    ToWorker,
)
from llamafleet.fleet.pipe import WorkerPipe
from llamafleet.rpc import check_reachable

if TYPE_CHECKING:
    from llamafleet.engine.engine import Engine
    from llamafleet.engine.pytorch.engine import TorchEngine

log = logging.getLogger(__name__)

PROGRESS_STEP = 0.1  # report loading progress in steps of 10%


class _ParentGone(Exception):
    """The API process closed its end of the pipe."""


class _Inbox:
    """Receives commands on a thread of its own, so the pipe is drained while the engine thread decodes."""

    def __init__(self, pipe: WorkerPipe) -> None:
        self._queue: queue.Queue[ToWorker] = queue.Queue()
        threading.Thread(target=self._pump, args=(pipe,), name="inbox", daemon=True).start()

    def _pump(self, pipe: WorkerPipe) -> None:
        try:
            while True:
                self._queue.put(cast(ToWorker, pipe.recv()))  # the API process sends nothing else
        except (EOFError, OSError):
            self._queue.put(Shutdown())  # nobody is left to read results: stop

    def take(self, wait_s: float) -> list[ToWorker]:
        """Every command waiting now; with ``wait_s`` > 0, wait up to that long for the first one."""
        msgs: list[ToWorker] = []
        if wait_s > 0:
            with contextlib.suppress(queue.Empty):
                msgs.append(self._queue.get(timeout=wait_s))
        while True:
            try:
                msgs.append(self._queue.get_nowait())
            except queue.Empty:
                return msgs


def _send(pipe: WorkerPipe, msg: FromWorker) -> None:
    try:
        pipe.send(msg)
    except OSError as e:  # BrokenPipeError, ConnectionResetError: the API process is gone
        raise _ParentGone from e


class _Outbox:
    """The engine loop's sends, and a thread beside it that sends a :class:`Pulse` whenever nothing at all was sent
    for ``beat_s`` (the engine is in a long step): the process is alive, so the replica is not suspect."""

    def __init__(self, pipe: WorkerPipe, beat_s: float) -> None:
        self.pipe = pipe
        self._beat_s = beat_s
        self._sent_at = time.monotonic()  # the last send of either thread
        threading.Thread(target=self._pulse, name="pulse", daemon=True).start()

    def send(self, msg: FromWorker) -> None:
        _send(self.pipe, msg)
        self._sent_at = time.monotonic()

    def _pulse(self) -> None:
        while True:
            time.sleep(self._beat_s / 2)
            if time.monotonic() - self._sent_at >= self._beat_s:
                try:
                    self.pipe.send(Pulse())
                except OSError:  # the API process is gone: the engine loop finds out on its next send
                    return
                self._sent_at = time.monotonic()


def _admit(engine: Engine | TorchEngine, msg: Submit, opened: dict[str, str]) -> Rejected | RequestOutput | None:
    """Tokenize ``msg`` and hand it to the engine; a request that cannot run comes back as :class:`Rejected`, one that
    is only tokenized as its one (finished) output. A chat whose prompt opened the model's think block gets that
    marker in ``opened``: its answer's text starts with it, so the API reads the answer as it was written."""
    try:
        if msg.embed is not None:
            inputs = tuple(i if isinstance(i, tuple) else tuple(engine.tokenize(i)) for i in msg.embed)
            engine.add_embedding(EmbeddingRequest(msg.request_id, inputs))
            return None
        if msg.rerank is not None:
            engine.add_rerank(msg.request_id, *msg.rerank)
            return None
        marker = ""
        if msg.prompt_ids is not None:
            ids = list(msg.prompt_ids)
        elif msg.infill is not None:
            ids = engine.tokenize_infill(msg.infill, msg.params.max_tokens)
        elif msg.chat is not None:
            ids = engine.tokenize_chat(_messages(msg), msg.tools)
            marker = engine.opened_think(ids)
        else:
            ids = engine.tokenize(msg.prompt, msg.add_special, msg.parse_special)
        if msg.tokenize_only:
            return engine.tokens_output(msg.request_id, ids, chat=msg.chat is not None)
        params = msg.params
        if marker and params.grammar is not None:  # the answer starts inside the think block
            params = dataclasses.replace(params, grammar=inside_think(params.grammar))
        engine.add_request(Request(msg.request_id, tuple(ids), params, msg.priority, msg.tenant, msg.prefix_keys,
                                   msg.prefix_share))
        if marker:
            opened[msg.request_id] = marker
    except ContextOverflow as e:
        return Rejected(msg.request_id, str(e), status=400, overflow=e)
    except EmbeddingUnavailable as e:
        return Rejected(msg.request_id, str(e), status=503)
    except ValueError as e:
        return Rejected(msg.request_id, str(e), status=400)
    except Exception as e:  # a failure of this request alone (e.g. a chat template error): report it, keep serving
        log.exception("request %s could not be started", msg.request_id)
        return Rejected(msg.request_id, f"{type(e).__name__}: {e}", status=500)
    return None


def _set_adapters(engine: Engine | TorchEngine, msg: SetAdapters) -> None:
    """Load and unload LoRA adapters as ``msg`` says; one llama.cpp refuses is logged (the API checked its header:
    requests naming it are then refused by this replica with a 400 that names it)."""
    lora = getattr(engine, "lora", None)  # (the torch engine serves no adapters: the API refuses them before)
    try:
        if lora is not None:
            lora.sync(msg.adapters)
    except ValueError:
        log.exception("LoRA adapters could not all be loaded")


def _messages(msg: Submit) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in msg.chat or ()]


def _locate_miss(engine: Engine | TorchEngine, chat: Submit, out: RequestOutput) -> None:
    """A chat's first output: for a prompt not served whole from a cache, the message where it first differed."""
    if out.cache is not None and out.cache.differs_at is not None:
        at = engine.message_at(_messages(chat), chat.tools, out.cache.differs_at)
        out.cache = dataclasses.replace(out.cache, differs_in_message=at)
        log.debug("request %s: prompt first differs from the cached prefix at token %d, in message %d",
                  out.request_id, out.cache.differs_at, at)


def _named_ids(out: RequestOutput) -> set[int]:
    """The token ids whose bytes the API needs to render ``out``'s top logprobs and prompt scores."""
    ids = {t for top in out.top_logprobs or [] for t, _ in top}
    if (scores := out.prompt_logprobs) is not None:
        ids.update(scores.token_ids)
        ids.update(t for top in scores.top or [] for t, _ in top)
    return ids


def _serve(engine: Engine | TorchEngine, pipe: WorkerPipe, inbox: _Inbox, beat_s: float) -> None:
    """The worker's loop: commands in, one engine step, one message out per step that produced anything, and a
    heartbeat after ``beat_s`` without one (pulses beside it, see :class:`_Outbox`)."""
    out = _Outbox(pipe, beat_s)
    active: dict[str, bool] = {}  # request id -> wants token pieces (logprobs)
    opened: dict[str, str] = {}  # request id -> the think marker its prompt opened, put before its first text
    chats: dict[str, Submit] = {}  # chat request id -> its request, until its first output (cache diagnostics)
    stopping = False
    sent_at = time.monotonic()
    while True:
        rejected: list[Rejected] = []
        counted: list[RequestOutput] = []
        for msg in inbox.take(wait_s=0 if engine.has_work() or stopping else beat_s):
            if isinstance(msg, Submit):
                answer = (
                    Rejected(msg.request_id, "the replica is shutting down; retry the request", status=503)
                    if stopping
                    else _admit(engine, msg, opened)
                )
                if answer is None:
                    active[msg.request_id] = msg.params.logprobs
                    if msg.chat is not None:
                        chats[msg.request_id] = msg
                elif isinstance(answer, Rejected):
                    rejected.append(answer)
                else:
                    counted.append(answer)
            elif isinstance(msg, Abort):
                engine.abort(msg.request_id)
            elif isinstance(msg, SetAdapters):
                _set_adapters(engine, msg)
            elif not stopping:  # Shutdown
                stopping = True
                for rid in active:
                    engine.abort(rid)
        outputs = engine.step() if engine.has_work() else []
        pieces = {o.request_id: [engine.token_bytes(t) for t in o.token_ids] for o in outputs if active[o.request_id]}
        for o in outputs:
            if o.top_logprobs or o.prompt_logprobs:
                o.token_bytes = {t: engine.token_bytes(t) for t in _named_ids(o)}
        for o in outputs:
            if (chat := chats.pop(o.request_id, None)) is not None:
                _locate_miss(engine, chat, o)
            if o.request_id in opened:
                o.text = opened.pop(o.request_id) + o.text
            if o.finished:
                del active[o.request_id]
        outputs += counted
        held = engine.held_change()  # (what its KV holds now: for routing)
        if outputs or rejected or held is not None:
            out.send(StepOutputs(outputs=outputs, rejected=rejected, pieces=pieces, stats=engine.stats(), held=held))
            sent_at = time.monotonic()
        elif time.monotonic() - sent_at >= beat_s:
            out.send(Heartbeat())
            sent_at = time.monotonic()
        if stopping and not engine.has_work():
            return


class _Progress:
    """Forwards the model load's progress to the API process in steps of :data:`PROGRESS_STEP`."""

    def __init__(self, pipe: WorkerPipe) -> None:
        self._pipe = pipe
        self._sent = 0.0

    def __call__(self, fraction: float) -> None:
        if fraction >= 1.0 or fraction - self._sent >= PROGRESS_STEP:
            self._sent = fraction
            with contextlib.suppress(OSError):  # inside llama.cpp's callback: a dead pipe surfaces at Ready
                self._pipe.send(LoadProgress(fraction))


def _load(cfg: EngineConfig, pipe: WorkerPipe) -> Engine | TorchEngine:
    """The engine ``cfg`` names, imported only now: after the environment is set (CUDA reads it once)."""
    if cfg.engine == "torch":
        from llamafleet.engine.pytorch.engine import TorchEngine

        return TorchEngine(cfg, progress=_Progress(pipe))
    # llama.cpp before anything imports numpy (see engine/llama.py's docstring)
    import llamafleet.engine.llama  # noqa: F401
    from llamafleet.engine.engine import Engine

    return Engine(cfg, progress=_Progress(pipe))


def worker_main(sock: socket.socket, replica: int, env: dict[str, str], cfg: EngineConfig, log_level: str,
                beat_s: float) -> None:
    """Entry point of a replica's process (the target of ``multiprocessing`` spawn); ``sock`` is its end of the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)  # before llama.cpp is imported: CUDA reads CUDA_VISIBLE_DEVICES once, at load
    logging.basicConfig(
        level=log_level.upper(),
        # the model's file names it in the log: a server of several models has a replica 0 of each
        format=f"%(asctime)s %(levelname)s replica {replica} of {Path(cfg.model_path).stem} %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    pipe = WorkerPipe(sock)
    inbox = _Inbox(pipe)
    t0 = time.monotonic()
    try:
        try:
            for endpoint in cfg.rpc_servers:  # llama.cpp would abort the process on one that does not answer
                check_reachable(endpoint)
            engine = _load(cfg, pipe)
        except Exception as e:
            log.exception("loading %s failed", cfg.model_path)
            _send(pipe, LoadFailed(f"{type(e).__name__}: {e}"))
            raise SystemExit(1) from None
        with engine:
            family = engine.family
            _send(pipe, Ready(pid=os.getpid(), n_seq=cfg.n_seq, n_ctx_per_seq=engine.n_ctx_per_seq,
                              load_seconds=time.monotonic() - t0, family=None if family is None else family.name,
                              reranker=engine.model.reranks, reports_held=engine.reports_held,
                              disk_tier=None if (disk := engine.disk_tier()) is None
                              else f"{socket.gethostname()}:{disk}"))
            _serve(engine, pipe, inbox, beat_s)
        log.info("context and model freed; exiting")  # the server's shutdown waits for this exit
    except _ParentGone:
        log.warning("the server went away; exiting")
    finally:
        pipe.close()
