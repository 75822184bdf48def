"""``serve --ray``: join the Ray cluster, read every node's own facts on that node, plan, and launch through Ray.

The API process, the router and the dispatcher run where the command runs (it becomes a Ray driver); only the
replicas' workers run on the cluster (:mod:`llamafleet.fleet.ray_workers`). What each node has is read *on that
node*, by a Ray task pinned to it (its GPUs through NVML, the way ``check-env`` and the planner read this machine's;
its RAM; whether the model file is at the configured path), and the planner plans each node on those facts
(:mod:`llamafleet.placement.nodes`).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from llamafleet.config import ConfigError, FleetConfig
from llamafleet.fleet.launch import ReplicaSpec
from llamafleet.fleet.ray_workers import Placement, RayLauncher, WorkerListener
from llamafleet.fleet.specs import plan_specs
from llamafleet.model.header import ModelInfo
from llamafleet.placement.gpus import Inventory, detect_inventory
from llamafleet.placement.nodes import ClusterPlan, Node, plan_nodes

log = logging.getLogger(__name__)

FACTS_TIMEOUT_S = 120.0  # every node must report its facts within this long
REACH_TIMEOUT_S = 5.0  # the cluster's address must accept a connection within this long


@dataclass(frozen=True)
class RayFleet:
    """What ``serve --ray`` starts: the replicas' specs and the launcher that places them on the cluster."""

    specs: list[ReplicaSpec]
    launcher: RayLauncher
    plan: ClusterPlan


def connect(address: str, log_level: str) -> None:
    """Join the Ray cluster at ``address`` ("auto": the one started on this host with ``ray start``).

    An address where nothing listens is refused at once: Ray itself would retry it for minutes."""
    if address != "auto":
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
        except (OSError, ValueError) as e:
            raise ConfigError(f"ray: nothing answers at '{address}' ({e}); give the head node's HOST:PORT (the port "
                              "`ray start --head` printed, 6379 by default), or 'auto' on a host that ran `ray start`"
                              ) from None
    try:
        ray.init(address=address, logging_level=log_level.upper(), log_to_driver=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ConfigError(f"ray: cannot join the Ray cluster at '{address}' ({e}); start one with `ray start --head` "
                          "on this host (then --ray auto), or give its address (--ray HOST:6379)") from None


def _node_facts(model_path: str) -> tuple[Inventory, bool]:
    """Run on a node: its GPU inventory and RAM, and whether the model file is there."""
    return detect_inventory(), os.path.isfile(model_path)


def gather(model_path: str) -> list[Node]:
    """Every live node's facts, each read on that node."""
    nodes = [n for n in ray.nodes() if n["Alive"]]
    task = ray.remote(_node_facts)
    refs = [task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(model_path) for n in nodes]
    try:
        facts = ray.get(refs, timeout=FACTS_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise ConfigError(f"ray: not every node of the cluster reported its GPUs within {FACTS_TIMEOUT_S:g}s; check "
                          "`ray status` and that llamafleet is installed on every node") from None
    return [Node(n["NodeID"], n["NodeManagerAddress"], float(n["Resources"].get("CPU", 0)),
                 int(n["Resources"].get("GPU", 0)), inventory, has_model)
            for n, (inventory, has_model) in zip(nodes, facts, strict=True)]


def ray_fleet(model: ModelInfo, cfg: FleetConfig, model_path: str) -> RayFleet:
    """Plan ``model`` over the cluster's nodes and make one spec and placement per replica; the plan says where
    (``plan.fits`` False: no node can run a replica)."""
    host = ray.util.get_node_ip_address()
    try:  # before the nodes are asked for their facts: a port in use is refused at once
        listener = WorkerListener(host, cfg.ray_port)
    except OSError as e:
        raise ConfigError(f"ray_port: cannot listen on {host}:{cfg.ray_port} for the replicas ({e.strerror}); choose "
                          "another ray_port, or 0 for any free port") from None
    plan = plan_nodes(model, gather(model_path), cfg, model_path)
    specs: list[ReplicaSpec] = []
    placements: list[Placement] = []
    for node_plan in plan.nodes:
        node, p = node_plan.node, node_plan.plan
        node_specs = plan_specs(p, node_plan.cfg, model_path, f"node {node.address}, ", here=False)
        specs += node_specs
        placements += [Placement(node.node_id, node.address, 0 if r.gpus else float(s.model_engine.n_threads or 1),
                                 len(r.gpus)) for r, s in zip(p.replicas, node_specs, strict=True)]
    return RayFleet(specs, RayLauncher(listener, placements, cfg.ray_place_timeout_s), plan)
