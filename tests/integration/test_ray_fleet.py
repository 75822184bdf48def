"""``serve --ray`` on a real Ray cluster of several nodes on this machine (Ray's own ``cluster_utils``), all on
loopback: the demo model's replicas on different nodes share the requests; a node removed under load fails only the
requests it ran, with the 503 a dead replica gives, while the other node keeps serving; its replica waits, reported
down, until a node with room joins, then comes back there; a replica whose loads fail frees its node for the retries,
and one restarted where the model file is missing says which node and path; an address where no cluster listens is
refused at once.

Each node offers Ray one CPU, so each holds exactly one CPU replica (one thread). The server is stopped, then the
cluster shut down, at the end of the module.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import ray
from ray.cluster_utils import Cluster
from test_server_faults import _Stream

from conftest import FleetServer, free_port

pytestmark = pytest.mark.slow

HEADER = "x-llamafleet-replicas"
LOOPBACK = {"node_ip_address": "127.0.0.1", "object_store_memory": 100 << 20}  # every Ray address on 127.0.0.1
NODE = {"num_cpus": 1, **LOOPBACK}
PLACE_TIMEOUT_S = 8  # ray_place_timeout_s (30 s by default): how long a lost replica waits for room, each attempt


def _parent(pid: int) -> int:
    """The parent pid of ``pid`` (a Ray worker's parent is its node's raylet)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _raylet(node: Any) -> int:
    return int(node.all_processes[ray._private.ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)


@dataclass
class RayCluster:
    """Ray's test cluster and its nodes that run replicas."""

    cluster: Any
    nodes: list[Any]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """A head node that runs nothing, and two nodes of one CPU each."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, **LOOPBACK})
    try:
        nodes = [cluster.add_node(**NODE), cluster.add_node(**NODE)]
        cluster.wait_for_nodes()
        yield RayCluster(cluster, nodes)
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def ray_model(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the demo model that the last test takes away from every node."""
    copy = tmp_path_factory.mktemp("ray-model") / model_path.name
    shutil.copyfile(model_path, copy)
    return copy


@pytest.fixture(scope="module")
def ray_server(ray_cluster: RayCluster, launch_fleet: Callable[[list[str]], FleetServer], ray_model: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetServer]:
    config = tmp_path_factory.mktemp("ray-config") / "fleet.yaml"
    config.write_text(f"ray_place_timeout_s: {PLACE_TIMEOUT_S}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # the server's Ray side on 127.0.0.1 too
        server = launch_fleet(["--config", str(config), "--model", str(ray_model), "--ray",
                               ray_cluster.cluster.address, "--parallel", "4", "--ctx", "512"])
    server.wait_ready()
    yield server
    server.stop()  # before the cluster goes


def _replicas(server: FleetServer) -> list[dict[str, Any]]:
    return list(server.ready()[1]["replicas"])


def _on(node: Any, replica: dict[str, Any]) -> bool:
    return _parent(int(replica["pid"])) == _raylet(node)


def test_ray_replicas_on_two_nodes_share_the_requests(ray_server: FleetServer, ray_cluster: RayCluster) -> None:
    body = ray_server.wait_all_ready()
    a, b = ray_cluster.nodes
    reps = body["replicas"]
    assert [r["status"] for r in reps] == ["ready", "ready"]
    assert all(r["where"] == "node 127.0.0.1, CPU" for r in reps), reps
    assert {_on(a, reps[0]), _on(b, reps[0])} == {True, False}, "replica 0 runs on neither node"
    assert _on(a, reps[0]) != _on(a, reps[1]), "both replicas run on one node"
    raw = ray_server.client().chat.completions.with_raw_response.create(
        model=ray_server.model(), messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0, n=2)
    assert sorted(raw.headers[HEADER].split(",")) == ["0", "1"]
    assert all(c.message.content for c in raw.parse().choices)


def _wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f}s"
        time.sleep(0.5)


def test_ray_node_lost_under_load_fails_its_requests_and_the_replica_returns_on_a_node_with_room(
        ray_server: FleetServer, ray_cluster: RayCluster) -> None:
    reps = ray_server.wait_all_ready()["replicas"]
    a, b = ray_cluster.nodes
    lost_index = 0 if _on(b, reps[0]) else 1
    # the lost node's streams fail at once (a few tokens in): 100 tokens keep them running past the removal, and
    # the other node's run them to the end
    streams = [_Stream(ray_server, ray_server.model(), max_tokens=100) for _ in range(6)]
    for s in streams:
        s.start()
    for s in streams:
        assert s.started.wait(120), "a stream never started"
    assert {s.replica for s in streams} == {0, 1}

    ray_cluster.cluster.remove_node(b)
    for s in streams:
        s.join(180)
        assert not s.is_alive(), "a request hung after its node was lost"
    for s in streams:
        if s.replica == lost_index:
            assert isinstance(s.error, openai.APIError), s.finish
            assert f"replica {lost_index}" in str(s.error) and "retry" in str(s.error)
        else:
            assert s.error is None and s.finish == "length"

    # no node has a free CPU: the replica is down and says why; the other keeps serving
    def reported_down() -> bool:
        rep = _replicas(ray_server)[lost_index]
        return rep["status"] == "down" and "no node of the Ray cluster has 1 CPU(s) free" in (rep["last_error"] or "")

    _wait_for("the lost replica was not reported down for want of room", reported_down, 120)
    for _ in range(3):
        r = httpx.post(f"{ray_server.url}/v1/completions", timeout=60,
                       json={"model": ray_server.model(), "prompt": "hi", "max_tokens": 4})
        assert r.status_code == 200 and r.headers[HEADER] == str(1 - lost_index), r.text

    # a node with room joins: the replica starts there
    c = ray_cluster.cluster.add_node(**NODE)
    body = ray_server.wait_all_ready(timeout=180)
    back = body["replicas"][lost_index]
    assert back["restarts"] >= 1 and _on(c, back), back
    assert _on(a, body["replicas"][1 - lost_index])
    raw = ray_server.client().chat.completions.with_raw_response.create(
        model=ray_server.model(), messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0, n=2)
    assert sorted(raw.headers[HEADER].split(",")) == ["0", "1"]
    assert os.path.exists(f"/proc/{back['pid']}")


def test_ray_replica_whose_load_fails_frees_its_node_and_a_missing_model_file_is_named(ray_server: FleetServer,
                                                                                     ray_model: Path) -> None:
    reps = ray_server.wait_all_ready()["replicas"]
    # a file llama.cpp refuses, put in place of the model (replica 1 keeps the old file open, as a running one would)
    bad = ray_model.with_suffix(".bad")
    bad.write_bytes(b"not a GGUF file")
    os.replace(bad, ray_model)
    os.kill(int(reps[0]["pid"]), signal.SIGKILL)
    first = reps[0]["restarts"]

    # every failed load ends its actor, so each retry finds the CPU it freed (none waits for room)
    def retried() -> bool:
        rep = _replicas(ray_server)[0]
        return rep["restarts"] >= first + 3 and "no node" not in (rep["last_error"] or "no node")

    _wait_for("the replica was not retried on the node its failed loads freed", retried, 25)

    ray_model.unlink()  # from every node: they share this machine's files

    def says_why() -> bool:
        rep = _replicas(ray_server)[0]
        return rep["status"] == "down" and f"the model file {ray_model} is not on node 127.0.0.1" in (
            rep["last_error"] or "")

    _wait_for("the replica did not report the missing model file", says_why, 60)
    r = httpx.post(f"{ray_server.url}/v1/completions", timeout=60,
                   json={"model": ray_server.model(), "prompt": "hi", "max_tokens": 4})
    assert r.status_code == 200 and r.headers[HEADER] == "1", r.text


def test_ray_port_in_use_is_refused_naming_the_key(ray_cluster: RayCluster, model_path: Path, tmp_path: Path,
                                                   launch_fleet: Callable[[list[str]], FleetServer]) -> None:
    with socket.socket() as busy, pytest.MonkeyPatch.context() as mp:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = tmp_path / "fleet.yaml"
        config.write_text(f"ray_port: {port}\n")
        mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        server = launch_fleet(["--config", str(config), "--model", str(model_path), "--ray",
                               ray_cluster.cluster.address])
        assert server.proc.wait(120) == 2
    assert f"error: ray_port: cannot listen on 127.0.0.1:{port} for the replicas" in server.log(), server.log()


def test_ray_address_where_nothing_listens_is_refused_at_once(launch_fleet: Callable[[list[str]], FleetServer],
                                                            model_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    server = launch_fleet(["--model", str(model_path), "--ray", address])
    assert server.proc.wait(60) == 2
    assert f"error: ray: nothing answers at '{address}'" in server.log(), server.log()
