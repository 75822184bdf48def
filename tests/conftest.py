"""Shared fixtures: the real model, and real ``llamafleet serve`` processes driven over HTTP.

``fleet`` is the shared server (the demo model, 2 replicas x 4 slots, 512 tokens of context, one thread each: small
enough for a 2-core CI machine). In a module marked ``each_engine`` its tests run on it and on the torch engine's
shared server (the same shape, serving the tiny random checkpoint of tests/hf_models.py).
The shared servers are pooled (:func:`pooled`): the first module that needs one starts it, later modules reuse it,
and it is stopped after the last test that needs it (found when the tests are collected), so that no idle server takes
memory and workers from the tests after it. ``launch_fleet`` starts further servers with any flags: each is stopped at
the end of the test that started it, or of the module whose fixture did. Every server runs in its own session
(process group) and the whole group is killed at teardown, workers included.

Run on several pytest-xdist workers (scripts/test.sh: ``--dist loadfile --no-loadscope-reorder``), each worker has its
own pool and runs whole modules in collection order, so "no later test needs it" still holds per worker. xdist's
default order (modules by number of tests) would interleave the modules of the torch server with the others and
start it again for each.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from hf_models import tiny_checkpoint_path
from llamafleet.model.demo import default_model_path

READY_TIMEOUT_S = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FleetServer:
    """A running ``llamafleet serve``: its URL, process and combined stdout/stderr log."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    shared: bool = False  # pooled: kept past the end of the module that started it
    engine: str = "llama.cpp"  # its replicas' engine
    demo_model: bool = False  # the shared llama.cpp server's: a test may check what the demo model answers
    stopped: bool = False  # by stop(): its process group is gone (its pid may be another's by now)
    _client: OpenAI | None = None

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def ready(self) -> tuple[int, dict[str, Any]]:
        r = httpx.get(f"{self.url}/ready", timeout=10)
        return r.status_code, r.json()

    def model(self) -> str:
        return str(self.ready()[1]["model"])

    def client(self) -> OpenAI:
        """An OpenAI SDK client of this server (one, shared by threads; closed when the server stops)."""
        if self._client is None:
            self._client = OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120.0)
        return self._client

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """Poll ``/ready`` until it says 200; fail with the server's log if the server dies or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the server exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                status, body = self.ready()
                if status == 200:
                    return body
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        pytest.fail(f"the server was not ready within {timeout:.0f}s:\n{self.log()[-4000:]}")

    def wait_all_ready(self, timeout: float = READY_TIMEOUT_S) -> dict[str, Any]:
        """Like :meth:`wait_ready`, but past 200 "degraded" too: until every replica is up (after a restart)."""
        deadline = time.monotonic() + timeout
        body = self.wait_ready(timeout)
        while body["status"] != "ready" and time.monotonic() < deadline:
            time.sleep(0.2)
            body = self.wait_ready(max(1.0, deadline - time.monotonic()))
        return body

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0, signalled: bool = False) -> int | None:
        """Send ``sig`` to the server (unless it was ``signalled`` already), wait for it, then kill whatever is left of
        its process group."""
        if self._client is not None:
            self._client.close()
        rc: int | None = None
        if self.proc.poll() is None:
            if not signalled:
                self.proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                rc = self.proc.wait(timeout)
        else:
            rc = self.proc.returncode
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.stopped = True
        return rc


def stop_all(servers: list[FleetServer]) -> None:
    """Stop ``servers`` together: all are signalled first, then each is waited for (a server takes a second or two
    to exit: one after the other, that time adds up)."""
    running = [s for s in servers if not s.stopped]
    for server in running:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
    for server in running:
        server.stop(signalled=True)


def run_serve(args: list[str], log_path: Path) -> FleetServer:
    """Start ``llamafleet serve ARGS`` on a free port (``--port`` is added unless given)."""
    if "--port" not in args:
        args = [*args, "--port", str(free_port())]
    port = args[args.index("--port") + 1]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "llamafleet.cli", "serve", *args], stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return FleetServer(proc, f"http://127.0.0.1:{port}", log_path)


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model_path(progress=False)


_started: list[FleetServer] = []  # by launch_fleet, in order


@pytest.fixture(scope="session")
def launch_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[list[str]], FleetServer]]:
    """Start servers with ``launch_fleet(args)`` (not waited for); each is stopped at the end of the test that started
    it, or of the module whose fixture did (a pooled one after the last test that needs it)."""

    def launch(args: list[str]) -> FleetServer:
        server = run_serve(args, tmp_path_factory.mktemp("serve") / "server.log")
        _started.append(server)
        return server

    yield launch
    stop_all(_started)


@pytest.fixture(scope="module", autouse=True)
def _stop_the_modules_servers() -> Iterator[None]:
    """Stop the servers the module started (after its own fixtures' teardown), except the pooled ones."""
    first = len(_started)
    yield
    stop_all([server for server in _started[first:] if not server.shared])


@pytest.fixture(autouse=True)
def _stop_the_tests_servers() -> Iterator[None]:
    """Stop the servers a test started itself (in its body or its function-scoped fixtures) when it ends, so that
    none idles through the module's later tests; the module's fixtures have started theirs before this one."""
    first = len(_started)
    yield
    stop_all([server for server in _started[first:] if not server.shared])


_pool: dict[str, FleetServer] = {}  # pooled fixture's name -> its running server
_last_need: dict[str, int] = {}  # pooled fixture's name -> index of the last collected test that needs it
_index: dict[str, int] = {}  # test's node id -> its index in the run


def pooled(request: pytest.FixtureRequest, start: Callable[[], FleetServer]) -> FleetServer:
    """The server of the pooled fixture asking (named in ``POOLED``): ``start()`` (which waits until it is ready) the
    first time, the same server after that; started afresh if it was stopped and a test still asks for it."""
    server = _pool.get(request.fixturename)
    if server is None or server.stopped:
        server = _pool[request.fixturename] = start()
        server.shared = True
    return server


@pytest.fixture(scope="module")
def llama_fleet(request: pytest.FixtureRequest, launch_fleet: Callable[[list[str]], FleetServer],
                model_path: Path) -> FleetServer:
    """The shared llama.cpp server: the demo model, 2 replicas x 4 slots, 512 tokens each, one thread per replica."""

    def start() -> FleetServer:
        server = launch_fleet(["--model", str(model_path), "--replicas", "2", "--parallel", "4", "--ctx", "512",
                               "--threads", "1"])
        server.demo_model = True
        server.wait_ready()
        return server

    return pooled(request, start)


@pytest.fixture(scope="module")
def torch_fleet(request: pytest.FixtureRequest, launch_fleet: Callable[[list[str]], FleetServer],
                tmp_path_factory: pytest.TempPathFactory) -> FleetServer:
    """The shared torch server: the tiny random LLaMA checkpoint (tests/hf_models.py), 2 replicas x 4 slots, 512
    tokens each, one thread per replica."""

    def start() -> FleetServer:
        server = launch_fleet(["--model", str(tiny_checkpoint_path(tmp_path_factory)), "--replicas", "2",
                               "--parallel", "4", "--ctx", "512", "--threads", "1"])
        server.engine = "torch"
        server.wait_all_ready()
        return server

    return pooled(request, start)


POOLED = ("llama_fleet", "torch_fleet")  # the fixtures whose servers modules share
ENGINE_FIXTURES = {"llama.cpp": "llama_fleet", "torch": "torch_fleet"}  # the server ``fleet`` takes, by engine


def needs(item: pytest.Item) -> set[str]:
    """The pooled fixtures a test needs, ``fleet``'s included (it asks for its engine's server when it runs)."""
    names = set(getattr(item, "fixturenames", ())) & set(POOLED)
    if "fleet" in getattr(item, "fixturenames", ()):
        callspec = getattr(item, "callspec", None)
        names.add(ENGINE_FIXTURES[callspec.params.get("fleet", "llama.cpp") if callspec else "llama.cpp"])
    return names


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that need the torch server run one after the other, where the first of them would (each module
    whole, in its own order), so that the server is up for that stretch only instead of nearly the whole run."""
    modules = {item.path for item in items if "torch_fleet" in needs(item)}
    first = next((i for i, item in enumerate(items) if item.path in modules), None)
    if first is not None:
        items[first:] = ([item for item in items[first:] if item.path in modules]
                         + [item for item in items[first:] if item.path not in modules])


def pytest_collection_finish(session: pytest.Session) -> None:
    for i, item in enumerate(session.items):
        _index[item.nodeid] = i
        for name in needs(item):
            _last_need[name] = i


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test's teardown, stop the pooled servers that no later test needs."""
    yield
    i = _index.get(item.nodeid, -1)
    stop_all([server for name, server in _pool.items() if nextitem is None or _last_need.get(name, -1) <= i])


ENGINES = ("llama.cpp", "torch")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """In a module marked ``each_engine``, every test that takes the server (``fleet``, ``client`` or ``model``)
    runs on the shared server of each engine, unless it is marked ``llama_cpp_only`` with its reason."""
    if metafunc.definition.get_closest_marker("each_engine") is None or "fleet" not in metafunc.fixturenames:
        return
    only = metafunc.definition.get_closest_marker("llama_cpp_only")
    if only is not None:
        if not only.kwargs.get("reason"):
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: llama_cpp_only needs reason=... (why the test "
                                    "cannot run on a torch replica)")
        return
    metafunc.parametrize("fleet", ENGINES, indirect=True, scope="module")


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest) -> FleetServer:
    """The shared server: llama.cpp's (``llama_fleet``), or in a module marked ``each_engine`` each engine's in turn
    (the test's id names it)."""
    engine = getattr(request, "param", "llama.cpp")
    return request.getfixturevalue("torch_fleet" if engine == "torch" else "llama_fleet")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def client(fleet: FleetServer) -> OpenAI:
    """The OpenAI SDK's client of the shared server."""
    return fleet.client()


@pytest.fixture(scope="module")
def model(fleet: FleetServer) -> str:
    """The shared server's model name."""
    return fleet.model()
