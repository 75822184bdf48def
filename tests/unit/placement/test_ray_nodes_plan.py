"""Planning one model over the nodes of a Ray cluster (placement/nodes.py): each node on its own facts, one shape
for all, ``replicas`` and ``threads`` per node, and a reason for every node that gets no replica; and the
configuration ``ray`` refuses."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from test_planner import inventory

from llamafleet.config import ConfigError, FleetConfig, load_config
from llamafleet.model.header import ModelInfo
from llamafleet.placement.gpus import Inventory
from llamafleet.placement.nodes import Node, plan_nodes
from synth_models import sparse_models

CPU_ONLY = Inventory(gpus=(), links=(), source="none", note="no GPU", host_mem_mib=64_000)
PATH = "/models/llama.gguf"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelInfo]:
    return sparse_models(tmp_path_factory)


def node(name: str, inv: Inventory, cpus: float = 8, gpus: int | None = None, has_model: bool = True) -> Node:
    return Node(name, f"10.0.0.{name}", cpus, len(inv.gpus) if gpus is None else gpus, inv, has_model)


def where(models: dict[str, ModelInfo], nodes: list[Node], **cfg: Any) -> list[tuple[str, str, int | None]]:
    plan = plan_nodes(models["7b-q4_0"], nodes, FleetConfig(**cfg), PATH)
    return [(p.node.node_id, r.label, p.cfg.threads) for p in plan.nodes for r in p.plan.replicas]


def test_ray_each_node_is_planned_on_its_own_gpus_or_cpus(models: dict[str, ModelInfo]) -> None:
    nodes = [node("1", inventory("2x24gb-pcie")), node("2", CPU_ONLY, cpus=6), node("3", inventory("1x24gb"))]
    assert where(models, nodes) == [("1", "GPU 0", None), ("1", "GPU 1", None), ("2", "CPU", 6), ("3", "GPU 0", None)]
    # replicas counts per node; a CPU node's Ray CPUs are shared by its replicas
    assert where(models, nodes[1:2], replicas=2) == [("2", "CPU", 3), ("2", "CPU", 3)]
    assert where(models, nodes[1:2], replicas=2, threads=5) == [("2", "CPU", 5), ("2", "CPU", 5)]


def test_ray_one_shape_for_every_node_chosen_on_the_first(models: dict[str, ModelInfo]) -> None:
    small = replace(inventory("1x24gb"), gpus=tuple(replace(g, free_mib=6000) for g in inventory("1x24gb").gpus))
    big = inventory("2x24gb-pcie")
    plan = plan_nodes(models["7b-q4_0"], [node("1", small), node("2", big)], FleetConfig(), PATH)
    shapes = {(p.plan.n_seq, p.plan.n_ctx_per_seq) for p in plan.nodes}
    assert len(shapes) == 1 and len(plan.nodes) == 2, plan.notes
    first = plan_nodes(models["7b-q4_0"], [node("1", small)], FleetConfig(), PATH).nodes[0].plan
    second = plan_nodes(models["7b-q4_0"], [node("2", big)], FleetConfig(), PATH).nodes[0].plan
    assert (first.n_seq, first.n_ctx_per_seq) != (second.n_seq, second.n_ctx_per_seq)  # alone, they differ
    assert shapes == {(first.n_seq, first.n_ctx_per_seq)}


def test_ray_nodes_without_the_model_or_resources_get_no_replica_and_a_reason(models: dict[str, ModelInfo]) -> None:
    nodes = [node("1", CPU_ONLY, has_model=False), node("2", CPU_ONLY, cpus=0), node("3", inventory("1x24gb"), gpus=0,
                                                                                   cpus=2)]
    plan = plan_nodes(models["7b-q4_0"], nodes, FleetConfig(), PATH)
    assert [(p.node.node_id, p.plan.device) for p in plan.nodes] == [("3", "cpu")]  # its GPU is not Ray's to give
    assert any("node 10.0.0.1: no replica, the model file /models/llama.gguf is not there" in n for n in plan.notes)
    assert any("node 10.0.0.2: no replica, it offers no CPU or GPU to Ray" in n for n in plan.notes)
    none = plan_nodes(models["70b-q8_0"], [node("1", inventory("1x24gb"))], FleetConfig(), PATH)
    assert not none.fits and "no replica, the plan does not fit" in none.notes[0]


def test_ray_serves_one_model_and_says_so_for_several() -> None:
    with pytest.raises(ConfigError, match="ray serves one model for now, but models_dir names several"):
        load_config(overrides={"ray": "auto", "models_dir": "/models"})
    assert load_config(overrides={"ray": "auto"}).ray_port == 0
