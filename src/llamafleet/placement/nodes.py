"""One model over the nodes of a cluster: each node planned on its own GPUs, all replicas of one shape.

Pure logic over :func:`~llamafleet.placement.planner.make_plan`: the facts of each node (its GPU inventory and RAM,
read on that node; the CPUs it offers to Ray; whether the model file is there) come in, one plan per node comes out.

* The **shape** (slots and context per replica) is fixed once, by the first node that can run the model
  (:func:`~llamafleet.placement.packing.fix_shape`: auto-fit applies there), and every other node is planned with
  it: the API process checks one context length for all replicas.
* Each node is then planned alone, as ``llamafleet serve`` plans one machine: one replica per GPU that holds the
  model, a split over the fewest GPUs otherwise; on a node without GPUs, ``replicas`` (default 1) CPU replicas
  sharing the CPUs that node offers to Ray (``threads`` unset: divided between them).
* ``replicas`` therefore counts per node. A node without the model file, without CPUs or GPUs for Ray, or on which
  the plan does not fit, gets no replica and a line that says why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llamafleet.config import FleetConfig
from llamafleet.model.header import ModelInfo
from llamafleet.placement.gpus import Inventory
from llamafleet.placement.packing import fix_shape
from llamafleet.placement.plan import Plan
from llamafleet.placement.planner import make_plan


@dataclass(frozen=True)
class Node:
    """What one node of the cluster has, as read on it."""

    node_id: str
    address: str  # its IP
    cpus: float  # the CPUs it offers to Ray
    gpus: int  # the GPUs it offers to Ray
    inventory: Inventory
    has_model: bool


@dataclass(frozen=True)
class NodePlan:
    """One node's plan and the configuration its replicas launch with."""

    node: Node
    plan: Plan
    cfg: FleetConfig


@dataclass(frozen=True)
class ClusterPlan:
    """The nodes that run replicas, and one line per node that runs none (or a warning) saying why."""

    nodes: tuple[NodePlan, ...]
    notes: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return bool(self.nodes)


def plan_nodes(model: ModelInfo, nodes: list[Node], cfg: FleetConfig, model_path: str) -> ClusterPlan:
    """Plan ``model`` (at ``model_path`` on every node) on each of ``nodes`` (see the module docstring)."""
    notes: list[str] = []
    usable = []
    for node in nodes:
        if not node.has_model:
            notes.append(f"node {node.address}: no replica, the model file {model_path} is not there (every node "
                         "needs the GGUF at the same path)")
        elif node.cpus < 1 and not node.gpus:
            notes.append(f"node {node.address}: no replica, it offers no CPU or GPU to Ray")
        else:
            usable.append(node)
    shaped: FleetConfig | None = None
    planned = []
    for node in usable:
        node_cfg = _per_node(cfg if shaped is None else shaped, node)
        if shaped is None:
            plan, fixed = fix_shape(model, _ray_view(node), node_cfg)
            if plan.fits:
                shaped = fixed.model_copy(update={"threads": cfg.threads})
                node_cfg = _per_node(shaped, node)
        else:
            plan = make_plan(model, _ray_view(node), node_cfg)
        if plan.fits:
            planned.append(NodePlan(node, plan, node_cfg))
            notes.extend(f"node {node.address}: warning: {w}" for w in plan.warnings)
        else:
            notes.append(f"node {node.address}: no replica, the plan does not fit: " + "; ".join(plan.reasons[1:]))
    return ClusterPlan(tuple(planned), tuple(notes))


def _per_node(cfg: FleetConfig, node: Node) -> FleetConfig:
    """``cfg`` for ``node``: on a CPU node, ``threads`` unset becomes its Ray CPUs shared by its replicas."""
    if node.inventory.gpus or cfg.threads is not None:
        return cfg
    return cfg.model_copy(update={"threads": max(1, int(node.cpus) // (cfg.replicas or 1))})


def _ray_view(node: Node) -> Inventory:
    """The node's inventory as Ray lets it be used: no GPU when the node offers none to Ray."""
    if node.gpus or not node.inventory.gpus:
        return node.inventory
    return replace(node.inventory, gpus=(), links=(), note="this node offers no GPU to Ray")
