"""Replicas on other hosts: each worker runs as a Ray actor and connects back to the API process over TCP.

Why this shape: everything that makes a replica safe to serve from (the readiness handshake, heartbeats, death and
hang detection, failing in-flight work with 503, restart with backoff) lives in :mod:`llamafleet.fleet.replicas` and
works on any stream socket. So Ray is used for what it is good at, and only that: finding a node with the resources a
replica needs and starting a process there (an actor, with ``num_cpus`` / ``num_gpus`` from the plan, placed on the
node the planner chose). The actor runs the same :func:`~llamafleet.fleet.worker.worker_main` as a local worker and
speaks the same framed protocol (:mod:`llamafleet.fleet.pipe`) over a TCP connection it opens to the API process;
tokens stream back over that connection, never through Ray's object store. The router, the dispatcher and every
route do not know the difference.

* **Who may connect**: the API process listens on one port (:class:`WorkerListener`); each launch makes a fresh
  random token, and a connection counts only after it has sent a token that is expected (compared in constant time,
  used once). Nothing is unpickled from a connection before that.
* **Placement**: the actor asks for the replica's resources with a soft affinity to its planned node: it starts
  there while that node lives, and on another node with the same resources free after the node is gone. A replica
  that no node has room for waits ``ray_place_timeout_s`` (30 s), then its load fails with a message that says so; the
  replica set retries with backoff, so it comes back when a node with room joins.
* **Deaths**: a killed actor or a lost node closes the socket (or, for a host that vanished from the network, its
  heartbeats stop): the replica set's usual death or hang path takes over. Ray ties each actor to this process, so
  workers never outlive the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import signal
import socket
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from llamafleet.engine.types import EngineConfig
from llamafleet.fleet.launch import Launched, LoadError, ReplicaSpec
from llamafleet.fleet.worker import worker_main

log = logging.getLogger(__name__)

TOKEN_BYTES = 32
CONNECT_TIMEOUT_S = 30.0  # from the actor's start to its connection back
HANDSHAKE_TIMEOUT_S = 10.0  # a connection must send its token within this long


@dataclass(frozen=True)
class Placement:
    """Where the planner put a replica and what it holds there (Ray resources)."""

    node_id: str
    address: str  # the node's IP, for people
    num_cpus: float
    num_gpus: int


class ReplicaActor:
    """The Ray actor of one replica (made remote in :class:`RayLauncher`): the worker's process on its node."""

    def where(self, model_path: str) -> tuple[int, str, bool, list[str]]:
        """This process's pid, its node's id, whether the model file is there, and the GPUs Ray gave it."""
        gpus = [str(g) for g in ray.get_gpu_ids()]
        return os.getpid(), ray.get_runtime_context().get_node_id(), os.path.isfile(model_path), gpus

    def run(self, host: str, port: int, token: bytes, replica: int, env: dict[str, str], cfg: EngineConfig,
            log_level: str, beat_s: float) -> int:
        """Connect back to the API process, then be the replica's worker until it ends; returns the exit code."""
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one step's tokens go out at once
        sock.sendall(token)
        try:
            worker_main(sock, replica, env, cfg, log_level, beat_s)
        except SystemExit as e:  # a failed load ends the worker with an exit code, as in a local process
            return e.code if isinstance(e.code, int) else 1
        return 0


class RayWorker:
    """A replica's actor, handled like a process (see :class:`~llamafleet.fleet.launch.WorkerHandle`)."""

    def __init__(self, actor: Any, run: Any, pid: int) -> None:
        self._actor, self._run, self._pid = actor, run, pid
        self._killed = False

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def exitcode(self) -> int | None:
        if not self._ended(0):
            return None
        if self._killed:
            return -signal.SIGKILL
        try:
            return int(ray.get(self._run))
        except ray.exceptions.RayError:  # the actor died: its node was lost, or its process was killed
            return -signal.SIGKILL

    def kill(self) -> None:
        self._killed = True
        with contextlib.suppress(ray.exceptions.RayError):
            ray.kill(self._actor, no_restart=True)

    def join(self, timeout: float | None = None) -> None:
        if self._ended(timeout):  # the worker is done: free its actor's CPUs/GPUs now, not when the handle is collected
            with contextlib.suppress(ray.exceptions.RayError):
                ray.kill(self._actor, no_restart=True)

    def is_alive(self) -> bool:
        return not self._ended(0)

    def _ended(self, timeout: float | None) -> bool:
        done, _ = ray.wait([self._run], timeout=timeout)
        return bool(done)


class WorkerListener:
    """The port replicas on other hosts connect to: each connection is handed to the launch whose token it sends."""

    def __init__(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(64)
        self._sock.setblocking(False)
        self.host, self.port = host, int(self._sock.getsockname()[1])
        self._expected: dict[bytes, asyncio.Future[socket.socket]] = {}
        self._accepting: asyncio.Task[None] | None = None

    def expect(self) -> tuple[bytes, asyncio.Future[socket.socket]]:
        """A fresh one-time token and the future of the connection that will present it."""
        if self._accepting is None:
            self._accepting = asyncio.get_running_loop().create_task(self._accept())
        token = secrets.token_bytes(TOKEN_BYTES)
        future: asyncio.Future[socket.socket] = asyncio.get_running_loop().create_future()
        self._expected[token] = future
        future.add_done_callback(lambda _: self._expected.pop(token, None))
        return token, future

    def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        self._sock.close()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, peer = await loop.sock_accept(self._sock)
            loop.create_task(self._handshake(conn, peer))

    async def _handshake(self, conn: socket.socket, peer: Any) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        got = b""
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                while len(got) < TOKEN_BYTES:
                    chunk = await loop.sock_recv(conn, TOKEN_BYTES - len(got))
                    if not chunk:
                        break
                    got += chunk
        except (TimeoutError, OSError):
            pass
        match = next((t for t in self._expected if hmac.compare_digest(t, got)), None)
        future = self._expected.get(match) if match is not None else None
        if future is None or future.done():
            log.warning("a connection from %s to the worker port sent no expected token; closed", peer)
            conn.close()
            return
        future.set_result(conn)


class RayLauncher:
    """Starts each replica's worker as a Ray actor where the plan put it (see the module docstring)."""

    def __init__(self, listener: WorkerListener, placements: list[Placement], place_timeout_s: float) -> None:
        self._listener = listener
        self._placements = placements
        self._place_timeout_s = place_timeout_s  # how long a replica waits for a node with room (ray_place_timeout_s)
        self._actor_class = ray.remote(ReplicaActor)

    async def launch(self, replica: int, spec: ReplicaSpec, log_level: str, beat_s: float) -> Launched:
        place, engine = self._placements[replica], spec.model_engine
        need = f"{place.num_gpus} GPU(s)" if place.num_gpus else f"{place.num_cpus:g} CPU(s)"
        actor = self._actor_class.options(
            name=None, num_cpus=place.num_cpus, num_gpus=place.num_gpus, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(place.node_id, soft=True),
        ).remote()
        try:
            pid, node_id, has_model, gpus = await asyncio.wait_for(_wait(actor.where.remote(engine.model_path)),
                                                             self._place_timeout_s)
        except TimeoutError:
            ray.kill(actor, no_restart=True)
            raise LoadError(f"replica {replica}: no node of the Ray cluster has {need} free (waited "
                            f"{self._place_timeout_s:g}s, ray_place_timeout_s); it is retried, and starts once a node "
                            "with room joins") from None
        except ray.exceptions.RayError as e:
            raise LoadError(f"replica {replica}: its Ray actor failed to start: {e}") from None
        address = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), node_id)
        if not has_model:
            ray.kill(actor, no_restart=True)
            raise LoadError(f"replica {replica}: the model file {engine.model_path} is not on node {address}; "
                            "every node needs the GGUF at the same path")
        token, connected = self._listener.expect()
        # Ray's GPU assignment stands on a GPU replica: Ray tells the actor which GPUs are its own
        env = {k: v for k, v in spec.env.items() if not (place.num_gpus and k == "CUDA_VISIBLE_DEVICES")}
        run = actor.run.remote(self._listener.host, self._listener.port, token, replica, env, engine,
                               log_level, beat_s)
        # never cancelled (that would reach into Ray): it ends with the actor; its outcome is read through RayWorker
        ended = asyncio.ensure_future(_wait(run))
        ended.add_done_callback(lambda f: f.cancelled() or f.exception())
        done, _ = await asyncio.wait([connected, ended], timeout=CONNECT_TIMEOUT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        if connected not in done:
            connected.cancel()
            ray.kill(actor, no_restart=True)
            why = f"it ended first ({_error(ended)})" if ended in done else f"nothing came in {CONNECT_TIMEOUT_S:g}s"
            raise LoadError(f"replica {replica} on node {address} did not connect back to {self._listener.host}:"
                            f"{self._listener.port}: {why}; that port must be open to every node (ray_port)")
        where = f"node {address}, " + (f"GPU{'s' if len(gpus) > 1 else ''} {','.join(gpus)}" if gpus else "CPU")
        return Launched(RayWorker(actor, run, pid), connected.result(), where)


async def _wait(ref: Any) -> Any:
    """A Ray object's value, awaited without blocking the event loop."""
    return await asyncio.wrap_future(ref.future())


def _error(task: asyncio.Future[Any]) -> str:
    e = task.exception() if not task.cancelled() else None
    return f"{type(e).__name__}: {e}" if e else "it returned"
