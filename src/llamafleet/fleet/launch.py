"""How a replica's worker starts: its :class:`ReplicaSpec`, the :class:`Launcher` that starts it (child processes of
this one by default, :class:`ProcessLauncher`; Ray actors and remote members' relays have their own), and the
:class:`WorkerHandle` the replica set supervises it by (:mod:`llamafleet.fleet.replicas`)."""

from __future__ import annotations

import multiprocessing as mp
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llamafleet.engine.types import EngineConfig
from llamafleet.fleet.messages import Submit
from llamafleet.fleet.worker import worker_main


class LoadError(RuntimeError):
    """A replica's worker failed to load its model."""


@dataclass(frozen=True, kw_only=True)
class ReplicaSpec:
    """How to start one replica: the environment its process needs and its engine's configuration; a replica that
    loads no model (``engine`` None, a remote member's relay) has a ``launcher`` of its own."""

    env: dict[str, str]
    engine: EngineConfig | None
    label: str  # where it runs, for people: "CPU", "GPU 0", "GPUs 0,1"
    gpus: tuple[int, ...] = ()  # the GPUs (NVML indices) it runs on; none on the CPU
    launcher: Launcher | None = None  # how it starts when not as the replica set's others do
    refuses: Callable[[Submit], str | None] | None = None  # why it cannot serve a request (for the client), or None

    @property
    def loads_model(self) -> bool:
        """Whether its worker loads a model: then it takes the load lock, and the server waits for it at start."""
        return self.engine is not None

    @property
    def model_engine(self) -> EngineConfig:
        """``engine``, of a replica that loads a model (asking it of one that loads none is a bug)."""
        assert self.engine is not None, f"replica {self.label} loads no model"
        return self.engine


class WorkerHandle(Protocol):
    """A started worker, as supervision sees it: a ``multiprocessing`` process, or anything that acts like one."""

    @property
    def pid(self) -> int | None: ...

    @property
    def exitcode(self) -> int | None: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...


@dataclass(frozen=True)
class Launched:
    """A worker just started: its handle, the API process's end of its connected socket, and where it runs."""

    handle: WorkerHandle
    sock: socket.socket
    label: str


class Launcher(Protocol):
    """Starts the worker of one replica (raises :class:`LoadError` if it cannot)."""

    async def launch(self, replica: int, spec: ReplicaSpec, log_level: str, beat_s: float) -> Launched: ...


def spawn(target: Callable[..., None], replica: int, label: str, *args: object) -> Launched:
    """Start ``target(sock, replica, *args)`` as a child process of this one (multiprocessing ``spawn``: a fresh
    interpreter), ``sock`` being its end of a socketpair."""
    parent, child = socket.socketpair()
    process = mp.get_context("spawn").Process(target=target, args=(child, replica, *args),
                                              name=f"llamafleet-replica-{replica}", daemon=True)
    process.start()
    child.close()
    return Launched(process, parent, label)


class ProcessLauncher:
    """llama.cpp workers (:func:`~llamafleet.fleet.worker.worker_main`) as child processes of this one."""

    async def launch(self, replica: int, spec: ReplicaSpec, log_level: str, beat_s: float) -> Launched:
        return spawn(worker_main, replica, spec.label, spec.env, spec.model_engine, log_level, beat_s)


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
