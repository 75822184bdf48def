"""A plan's replicas as the replica set starts them: one :class:`~llamafleet.fleet.launch.ReplicaSpec` each, for
``serve``, the model manager, a Ray cluster's nodes and ``consistency`` alike."""

from __future__ import annotations

from llamafleet.config import FleetConfig
from llamafleet.fleet.launch import ReplicaSpec
from llamafleet.placement.plan import Plan
from llamafleet.placement.planner import launch_spec


def plan_specs(plan: Plan, cfg: FleetConfig, model_path: str, prefix: str = "", here: bool = True
               ) -> list[ReplicaSpec]:
    """A spec per replica of ``plan`` (its environment and engine from :func:`launch_spec`), labelled ``prefix`` and
    the replica's own label ("chat on GPU 0"). ``here=False``: the replicas run on another host, so their GPUs are not
    named (this host's watchdog reads the GPUs named, and those are not this host's)."""
    specs = []
    for i, r in enumerate(plan.replicas):
        env, engine = launch_spec(plan, i, cfg, model_path)
        specs.append(ReplicaSpec(env=env, engine=engine, label=f"{prefix}{r.label}", gpus=r.gpus if here else ()))
    return specs
