"""A service of one model whose replicas are never started, for tests of the HTTP side: served as ``serve`` serves
one model (a manager of one pinned model, placed up front)."""

from __future__ import annotations

from llamafleet.api.service import Service
from llamafleet.config import FleetConfig
from llamafleet.engine.types import EngineConfig
from llamafleet.fleet.launch import ReplicaSpec
from llamafleet.fleet.models import ModelManager, placed_model
from llamafleet.fleet.telemetry import FleetMetrics
from llamafleet.placement.plan import Plan

NEVER_LOADED = [ReplicaSpec(env={}, engine=EngineConfig(model_path="never-loaded.gguf"), label="CPU")]


def one_model_service(name: str, specs: list[ReplicaSpec] | None = None, cfg: FleetConfig | None = None,
                      api_keys: frozenset[str] = frozenset(), admin_keys: frozenset[str] = frozenset(),
                      plan: Plan | None = None, n_ctx_per_seq: int = 512) -> Service:
    cfg = cfg or FleetConfig()
    metrics = FleetMetrics()
    model = placed_model(name, specs or NEVER_LOADED, n_ctx_per_seq, cfg, metrics, plan=plan)
    return Service(ModelManager([model], cfg, metrics), api_keys, admin_keys)
