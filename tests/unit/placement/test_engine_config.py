"""One mapping of the configuration onto the engine's settings: ``serve`` (a plan's replica) and ``bench engine``
build the same engine from the same configuration, apart from what a plan or the benchmark decides."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from llamafleet.commands.bench import engine_settings
from llamafleet.config import FleetConfig
from llamafleet.engine.types import EngineConfig
from llamafleet.fleet.specs import plan_specs
from llamafleet.placement.gpus import load_inventory
from llamafleet.placement.planner import make_plan
from synth_models import sparse_models

TWO = load_inventory(Path(__file__).resolve().parents[3] / "examples" / "inventories" / "2x24gb-pcie.yaml")
# what a plan decides for each replica (shape, devices), and what bench engine sets from its own flags
DECIDED = {"n_seq", "n_ctx_per_seq", "split_mode", "main_gpu", "tensor_split", "rpc_servers", "kv_unified", "overlap"}
SETTINGS = FleetConfig(kv_cache_type="q8_0", flash_attn=True, prefix_cache=False, llama_log_level="debug",
                       backend_sampling=True, prefill_tokens=256, batch_size=1024, ubatch_size=256, threads=3,
                       n_gpu_layers=20, parallel=2, context_length=1024)


def test_bench_engine_and_serve_get_the_same_settings_from_one_config(tmp_path_factory: pytest.TempPathFactory
                                                                       ) -> None:
    info = sparse_models(tmp_path_factory)["7b-q4_0"]
    plan = make_plan(info, TWO, SETTINGS)
    assert plan.fits
    served = [spec.engine for spec in plan_specs(plan, SETTINGS, info.path)]
    assert len(served) == 2  # one replica per GPU
    bench = engine_settings(SETTINGS, info.path, n=4, max_tokens=64)
    compared = [f.name for f in fields(EngineConfig) if f.name not in DECIDED]
    assert {"kv_cache_type", "flash_attn", "prefix_cache", "llama_log_level"} <= set(compared)
    for engine in served:
        assert {n: getattr(engine, n) for n in compared} == {n: getattr(bench, n) for n in compared}
    assert (bench.kv_cache_type, bench.prefill_tokens, bench.n_threads, bench.n_gpu_layers) == ("q8_0", 256, 3, 20)
