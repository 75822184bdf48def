"""Starting and supervising the worker processes, one per replica, from the API process's event loop.

* Workers are started by a :class:`~llamafleet.fleet.launch.Launcher` (:mod:`llamafleet.fleet.launch`): by default
  multiprocessing's ``spawn`` (a fresh interpreter: the replica's environment is applied before llama.cpp is
  imported, see :mod:`llamafleet.fleet.worker`) on this machine; with ``--ray``, Ray actors on other hosts
  (:mod:`llamafleet.fleet.ray_workers`). Either way a worker talks over one duplex stream socket
  (:mod:`llamafleet.fleet.pipe`: messages of any size, sends that never block the event loop), and everything below
  (readiness, heartbeats, deaths, restarts) is the same.
* Model loads are serialized: one replica loads at a time, at start-up and on every restart (concurrent CUDA
  context creation is a known crash); the replica sets of several models share one lock for it.
* A worker's messages are handled as they arrive, and a worker that dies (even by SIGKILL) is noticed at once
  because the kernel closes its end of the pipe. Its in-flight work is failed by the listener and the replica is
  restarted with exponential backoff; the other replicas keep serving.
* A loaded worker that sends nothing (no step output, no heartbeat) for ``heartbeat_timeout_s`` is hung (frozen, or
  stuck in one step): it is taken out of routing, shown as "unresponsive", its work failed with 503, and it is killed
  and restarted like a crashed one. Loading is exempt: it reports its own progress and may take minutes.
* Well before that, a loaded worker that sends nothing at all (not even a pulse) for longer than its own recent steps
  explain is *suspect* (:mod:`llamafleet.fleet.suspicion`): the listener is told at once, and again the moment it
  speaks.
* A replica may load no model (``engine`` None): a remote member (:mod:`llamafleet.fleet.remote`), started by its
  spec's own launcher, relays to an upstream server over the same pipe protocol. It takes no load lock (no GPU) and
  loads in the background: an upstream that does not answer at start is retried with backoff, never fatal.
* On :meth:`ReplicaSet.stop` every worker is told to cancel its work and exit; one that does not within the bound
  is killed. Workers are daemonic and also exit when the server's end of the pipe closes, so nothing is orphaned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Literal, Protocol

from llamafleet.engine.types import EngineStats
from llamafleet.fleet.launch import Launcher, LoadError, ProcessLauncher, ReplicaSpec, WorkerHandle, describe_exit
from llamafleet.fleet.messages import (
    Heartbeat,
    LoadFailed,
    LoadProgress,
    Pulse,
    Ready,
    Shutdown,
    StepOutputs,
    ToWorker,
)
from llamafleet.fleet.pipe import AsyncPipe
from llamafleet.fleet.suspicion import SUSPECT_AFTER_S, Silence

log = logging.getLogger(__name__)

# "unresponsive": killed for silence past the heartbeat timeout, until it loads again
ReplicaStatus = Literal["idle", "loading", "ready", "unresponsive", "down", "stopped"]

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0  # a replica that stayed up this long restarts without backoff
PROGRESS_LOG_S = 5.0  # at most one loading-progress log line per replica this often
BEAT_MAX_S = 1.0  # a worker beats (and the API process checks) at least this often, and 4 times per timeout
SUSPECT_CHECK_S = 0.25  # how often silences are checked against their bounds


class ReplicaListener(Protocol):
    """What the replica set reports to (the dispatcher)."""

    def replica_up(self, replica: int, ready: Ready) -> None: ...

    def replica_down(self, replica: int, reason: str) -> None: ...

    def replica_output(self, replica: int, msg: StepOutputs) -> None: ...

    def replica_suspect(self, replica: int, suspect: bool) -> None: ...


@dataclass
class ReplicaState:
    """What is known about one replica, for health checks, logs and metrics."""

    index: int
    label: str
    status: ReplicaStatus = "idle"
    pid: int | None = None
    restarts: int = 0
    hangs: int = 0  # times killed for silence past the heartbeat timeout
    suspect: bool = False  # silent past its bound (fleet/suspicion.py), not yet hung
    suspicions: int = 0  # times it became suspect
    load_fraction: float = 0.0
    slots: int | None = None
    up_since: float | None = None
    last_error: str | None = None
    stats: EngineStats | None = None
    progress_logged_at: float = 0.0


@dataclass
class _Worker:
    process: WorkerHandle
    pipe: AsyncPipe
    silence: Silence  # since its last message of any kind (pulses too)
    loaded: asyncio.Future[Ready] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    heard_at: float = field(default_factory=time.monotonic)  # when its engine loop's last message arrived

    @property
    def up(self) -> bool:
        """It said Ready. A load that failed (``LoadFailed``, then the process exits) is done but was never up."""
        return self.loaded.done() and not self.loaded.cancelled() and self.loaded.exception() is None


class ReplicaSet:
    """The worker processes of all replicas: start, watch, restart, stop."""

    def __init__(self, specs: list[ReplicaSpec], log_level: str, heartbeat_timeout_s: float,
                 load_lock: asyncio.Lock | None = None, launcher: Launcher | None = None,
                 suspect_after_s: float = SUSPECT_AFTER_S) -> None:
        if not specs:
            raise ValueError("a replica set needs at least one replica")
        if heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be positive, got {heartbeat_timeout_s}")
        self.specs = specs
        self.states = [ReplicaState(i, s.label) for i, s in enumerate(specs)]
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.suspect_after_s = suspect_after_s
        self._beat_s = min(BEAT_MAX_S, heartbeat_timeout_s / 4)
        self._log_level = log_level
        self._workers: dict[int, _Worker] = {}
        self._listener: ReplicaListener | None = None
        self._load_lock = load_lock or asyncio.Lock()  # shared by the replica sets of several models
        self._restarts: dict[int, asyncio.Task[None]] = {}
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False
        self._launcher = launcher or ProcessLauncher()

    def __len__(self) -> int:
        return len(self.specs)

    async def start(self, listener: ReplicaListener) -> None:
        """Load every replica, one after another; :class:`LoadError` if one fails (then call :meth:`stop`)."""
        self._listener = listener
        self._watch = asyncio.get_running_loop().create_task(self._watch_heartbeats())
        for i, spec in enumerate(self.specs):  # an upstream down at start must not stop the server: it is retried
            if not spec.loads_model:
                self._restarts[i] = asyncio.get_running_loop().create_task(self._start_in_background(i))
        for i, spec in enumerate(self.specs):
            if spec.loads_model:
                await self._load(i)

    def send(self, replica: int, msg: ToWorker) -> None:
        """Queue ``msg`` for ``replica``'s worker (never blocks); a pipe that breaks reports the worker's death."""
        worker = self._workers.get(replica)
        if worker is None:
            self._report_down(replica, f"replica {replica} is not running")
            return
        worker.pipe.send(msg)

    def send_running(self, replica: int, msg: ToWorker) -> None:
        """Queue ``msg`` for ``replica``'s worker if one runs (loading or serving); none: nothing (one started later
        reads its spec)."""
        if replica in self._workers:
            self.send(replica, msg)

    def recycle(self, replica: int, why: str, status: ReplicaStatus = "down") -> None:
        """Kill ``replica``'s worker and load it again, as after a crash (its in-flight work fails with 503);
        ``status`` shows until it loads again."""
        worker = self._workers.get(replica)
        if worker is None or not worker.up:
            return
        log.error("replica %d: %s; killing worker pid %s", replica, why, worker.process.pid)
        worker.process.kill()  # SIGKILL: also ends a stopped (SIGSTOP) process
        self._on_exit(replica, worker, why, status)

    async def stop(self, timeout: float) -> None:
        """Tell every worker to cancel its work and exit; kill those still running after ``timeout`` seconds."""
        self._stopping = True
        for task in [*self._restarts.values(), *([self._watch] if self._watch else [])]:
            task.cancel()
        workers = dict(self._workers)
        for i in workers:
            self.send(i, Shutdown())
        deadline = time.monotonic() + timeout
        for i, w in workers.items():
            await asyncio.to_thread(w.process.join, max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                log.warning("replica %d did not exit within %.0fs; killing it", i, timeout)
                w.process.kill()
                await asyncio.to_thread(w.process.join, 5.0)
            self._on_exit(i, w, "the server is stopping")

    # -- loading ------------------------------------------------------------------------------------------------
    async def _load(self, i: int) -> None:
        async with self._load_lock if self.specs[i].loads_model else contextlib.nullcontext():  # no GPU to share
            if self._stopping:
                return
            worker = await self._spawn(i)
            try:
                ready = await worker.loaded
            except LoadError:
                await self._reap(i, worker.process)
                raise
        if self._workers.get(i) is not worker:
            return  # it died between Ready and here: _on_exit has already scheduled its restart
        state = self.states[i]
        state.status, state.up_since, state.slots = "ready", time.monotonic(), ready.n_seq
        log.info("replica %d/%d (%s): ready in %.1fs (%d slots x %d tokens)", i + 1, len(self), state.label,
                 ready.load_seconds, ready.n_seq, ready.n_ctx_per_seq)
        assert self._listener is not None
        self._listener.replica_up(i, ready)

    async def _start_in_background(self, i: int) -> None:
        try:
            await self._load(i)
        except LoadError as e:
            log.error("%s", e)
            await self._keep_loading(i, BACKOFF_FIRST_S)

    async def _spawn(self, i: int) -> _Worker:
        spec, state = self.specs[i], self.states[i]
        try:
            launched = await (spec.launcher or self._launcher).launch(i, spec, self._log_level, self._beat_s)
        except LoadError as e:
            state.status, state.last_error = "down", str(e)
            raise
        process, parent, state.label = launched.handle, launched.sock, launched.label
        worker = _Worker(process, AsyncPipe(lambda msg: self._handle(i, worker, msg),
                                            lambda why: self._on_closed(i, worker, why)),
                         Silence(self.suspect_after_s, time.monotonic()))
        self._workers[i] = worker
        state.status, state.pid, state.load_fraction, state.last_error = "loading", process.pid, 0.0, None
        state.stats = None
        await worker.pipe.open(parent)
        log.info("replica %d/%d (%s): loading %s (pid %s)", i + 1, len(self), state.label,
                 spec.engine.model_path if spec.engine is not None else "no model", process.pid)
        return worker

    async def _reap(self, i: int, process: WorkerHandle) -> None:
        """Wait for a failed worker's process to end (killing it if it lingers) and forget it."""
        await asyncio.to_thread(process.join, 10.0)
        if process.is_alive():
            process.kill()
            await asyncio.to_thread(process.join, 5.0)
        worker = self._workers.get(i)
        if worker is not None and worker.process is process:
            self._forget(i)
        log.warning("replica %d: worker pid %s %s", i, process.pid, describe_exit(process.exitcode))

    # -- messages, deaths and hangs ---------------------------------------------------------------------------
    def _on_closed(self, i: int, worker: _Worker, why: str) -> None:
        worker.process.join(0)  # reap it if it is already gone (never blocks), for the exit status
        code = worker.process.exitcode
        self._on_exit(i, worker, why if code is None else describe_exit(code))

    def _handle(self, i: int, worker: _Worker, msg: object) -> None:
        if self._workers.get(i) is not worker:
            return  # forgotten (killed) while its last messages were on the way
        now = time.monotonic()
        silent = worker.silence.heard(now)
        if silent is not None:
            self._suspect(i, False, f"it spoke again after {silent:.1f}s of silence; back in rotation")
        if isinstance(msg, Pulse):
            return  # the process is alive; its engine loop has not spoken (see the hang check)
        worker.heard_at = now
        if isinstance(msg, Heartbeat):
            pass
        elif isinstance(msg, StepOutputs):
            self.states[i].stats = msg.stats
            worker.silence.stepped(msg.stats)
            assert self._listener is not None
            self._listener.replica_output(i, msg)
        elif isinstance(msg, LoadProgress):
            state = self.states[i]
            now = time.monotonic()
            if now - state.progress_logged_at >= PROGRESS_LOG_S:  # big models: a line every few seconds
                state.progress_logged_at = now
                log.info("replica %d/%d: loading %3.0f%%", i + 1, len(self), 100 * msg.fraction)
            state.load_fraction = msg.fraction
        elif isinstance(msg, Ready):
            if not worker.loaded.done():  # done: nobody waits any more (the load was cancelled by a shutdown)
                worker.loaded.set_result(msg)
        elif isinstance(msg, LoadFailed):
            self.states[i].last_error = msg.message
            if not worker.loaded.done():
                self.states[i].status = "down"
                self._forget(i)  # it exits now: its pipe's end must not be taken for the death of a loaded replica
                worker.loaded.set_exception(LoadError(f"replica {i} failed to load: {msg.message}"))
        else:
            log.error("replica %d sent an unexpected message %r; ignored", i, msg)

    async def _watch_heartbeats(self) -> None:
        """Suspect loaded workers silent past their bound; kill those silent past the heartbeat timeout (see
        :meth:`recycle`)."""
        checked, tick = time.monotonic(), min(self._beat_s, SUSPECT_CHECK_S)
        while not self._stopping:
            await asyncio.sleep(tick)
            await asyncio.sleep(0)  # what arrived meanwhile is read first (uvloop runs timers before reading)
            now = time.monotonic()
            lag, checked = now - checked - tick, now
            if lag > 2 * self._beat_s - tick:  # this event loop was held up: let it read what came, check next time
                continue
            for i, worker in list(self._workers.items()):
                silent = now - worker.heard_at
                if worker.up and silent > self.heartbeat_timeout_s:
                    self.states[i].hangs += 1
                    self.recycle(i, f"it sent nothing for {silent:.1f}s (heartbeat_timeout_s is "
                                    f"{self.heartbeat_timeout_s:g}): hung", status="unresponsive")
                elif worker.up and lag < tick and (found := worker.silence.check(now)) is not None:
                    self._suspect(i, True, f"suspect: it sent nothing for {found[0]:.1f}s, past its bound of "
                                           f"{found[1]:.1f}s ({worker.silence.describe()})")

    def _on_exit(self, i: int, worker: _Worker, why: str, status: ReplicaStatus = "down") -> None:
        """``worker`` is gone: fail its work now, then restart the replica (unless stopping or still loading)."""
        if self._workers.get(i) is not worker:
            return
        self._forget(i)
        state = self.states[i]
        state.suspect = False  # down now: the router forgets it whole
        reason = f"replica {i} worker (pid {worker.process.pid}) stopped: {why}"
        if not worker.up:  # died while loading (or after LoadFailed): whoever awaits the load handles it
            if not worker.loaded.done():
                worker.loaded.set_exception(LoadError(f"replica {i} failed to load: {state.last_error or reason}"))
            state.status = "down"
            return
        state.status, state.last_error = ("stopped" if self._stopping else status), reason
        self._report_down(i, reason)
        if not self._stopping:
            log.error("%s", reason)
            self._restarts[i] = asyncio.get_running_loop().create_task(self._restart(i, worker.process))

    def _suspect(self, i: int, suspect: bool, why: str) -> None:
        state = self.states[i]
        state.suspect, state.suspicions = suspect, state.suspicions + suspect
        (log.warning if suspect else log.info)("replica %d/%d (%s): %s", i + 1, len(self), state.label, why)
        if self._listener is not None:
            self._listener.replica_suspect(i, suspect)

    def _report_down(self, i: int, reason: str) -> None:
        if self._listener is not None:
            self._listener.replica_down(i, reason)

    def _forget(self, i: int) -> None:
        worker = self._workers.pop(i, None)
        if worker is not None:
            worker.pipe.close()

    async def _restart(self, i: int, dead: WorkerHandle) -> None:
        """Reap the dead worker, then load the replica again, backing off while loads keep failing."""
        await self._reap(i, dead)
        state = self.states[i]
        stable = state.up_since is not None and time.monotonic() - state.up_since >= STABLE_AFTER_S
        await self._keep_loading(i, 0.0 if stable else BACKOFF_FIRST_S)

    async def _keep_loading(self, i: int, delay: float) -> None:
        """Load the replica after ``delay``, backing off while loads keep failing."""
        state = self.states[i]
        while not self._stopping:
            await asyncio.sleep(delay)
            state.restarts += 1
            try:
                await self._load(i)
                return
            except LoadError as e:
                log.error("%s", e)
                delay = min(BACKOFF_MAX_S, max(delay, BACKOFF_FIRST_S) * 2)
