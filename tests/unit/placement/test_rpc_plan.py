"""Plans with other hosts' devices (rpc_servers): when the planner uses them, how it splits, what it says about the
link, what it refuses; and the opt-in the configuration demands."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llamafleet.config import ConfigError, FleetConfig, load_config
from llamafleet.model.header import ModelInfo
from llamafleet.placement.gpus import Inventory, RemoteDevice, load_inventory
from llamafleet.placement.planner import launch_spec, make_plan
from synth_models import sparse_models

ROOT = Path(__file__).resolve().parents[3]
A, B = "10.0.0.2:50052", "10.0.0.3:50052"
REMOTE = (RemoteDevice(A, 0, 24576, 24000, 0.2), RemoteDevice(B, 0, 24576, 24000, 0.3))
RPC = {"rpc_servers": [A, B], "rpc_trusted_network": True, "parallel": 8, "context_length": 4096}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelInfo]:
    return sparse_models(tmp_path_factory)


def one_gpu() -> Inventory:
    return replace(load_inventory(ROOT / "examples" / "inventories" / "1x24gb.yaml"), rpc=REMOTE)


def test_rpc_plan_splits_a_model_too_big_for_the_host_over_remote_devices_first(
        models: dict[str, ModelInfo]) -> None:
    cfg = FleetConfig(**RPC)
    plan = make_plan(models["70b-q4_0"], one_gpu(), cfg)
    assert plan.fits, plan.reasons
    (r,) = plan.replicas
    assert r.rpc_servers == (A, B) and r.gpus == (0,) and r.split_mode == "layer"
    assert len(r.tensor_split) == 3 and abs(sum(r.tensor_split) - 1) < 1e-3  # A, B, then the local GPU
    assert [b.device for b in plan.budgets] == ["GPU 0", f"RPC {A}#0", f"RPC {B}#0"]
    assert all(b.weights_mib > 0 and b.overflow_mib == 0 for b in plan.budgets)
    link = next(x for x in plan.reasons if x.startswith("the link"))
    assert "8192 x 4 = 32768 bytes per token" in link and "2 network round trip(s) (0.30 ms" in link
    env, engine = launch_spec(plan, 0, cfg, "m.gguf")
    assert engine.rpc_servers == (A, B) and engine.tensor_split == r.tensor_split and engine.n_gpu_layers == -1
    assert env["CUDA_VISIBLE_DEVICES"] == "0"


def test_rpc_plan_leaves_remote_devices_alone_when_the_model_fits_the_host_unless_told(
        models: dict[str, ModelInfo]) -> None:
    local = make_plan(models["7b-q4_0"], one_gpu(), FleetConfig(**RPC))
    assert local.fits and local.replicas[0].rpc_servers == () and local.replicas[0].split_mode == "none"
    assert any("rpc_servers are not used: the model fits this host" in w for w in local.warnings)
    forced = make_plan(models["7b-q4_0"], one_gpu(), FleetConfig(**RPC, split_mode="layer"))
    assert forced.fits and forced.replicas[0].rpc_servers == (A, B)


def test_rpc_plan_on_a_cpu_host_keeps_the_last_layers_and_the_head_on_the_cpu(models: dict[str, ModelInfo]) -> None:
    host = Inventory(gpus=(), links=(), source="test", host_mem_mib=16000, rpc=REMOTE)
    cfg = FleetConfig(**RPC)
    plan = make_plan(models["13b-f16"], host, cfg)  # 26 GB of weights: more than this host's 16 GB of RAM
    assert plan.fits and plan.device == "cpu", plan.reasons
    (r,) = plan.replicas
    assert r.gpus == () and len(r.tensor_split) == 3 and r.n_gpu_layers == -1
    assert plan.budgets[0].device == "CPU" and plan.budgets[0].overflow_mib == 0
    _, engine = launch_spec(plan, 0, cfg, "m.gguf")
    assert engine.n_gpu_layers == -1 and engine.rpc_servers == (A, B) and engine.split_mode == "layer"
    small = make_plan(models["70b-f16"], host, cfg)  # 140 GB: does not fit 16 + 2 x 24 GB
    assert not small.fits and any("overflows by" in x for x in small.reasons)


@pytest.mark.parametrize(("extra", "said"), [
    ({"replicas": 2}, "an RPC server serves one client at a time"),
    ({"split_mode": "tensor"}, "split_mode is tensor"),
    ({"split_ratio": [1, 1, 1]}, "split_ratio cannot be combined with rpc_servers"),
])
def test_rpc_plan_refuses_what_an_rpc_split_cannot_do(models: dict[str, ModelInfo], extra: dict[str, object],
                                                      said: str) -> None:
    plan = make_plan(models["70b-q4_0"], one_gpu(), FleetConfig(**{**RPC, **extra}))
    assert not plan.fits and any(said in x for x in plan.reasons)


def test_rpc_config_needs_the_trusted_network_opt_in_and_valid_endpoints(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rpc_servers needs the opt-in rpc_trusted_network: true.*no authentication"):
        load_config(None, {"rpc_servers": [A]})
    with pytest.raises(ConfigError, match="'10.0.0.2' is not an RPC endpoint: write host:port"):
        load_config(None, {"rpc_servers": ["10.0.0.2"], "rpc_trusted_network": True})
    with pytest.raises(ConfigError, match="listed twice"):
        load_config(None, {"rpc_servers": [A, A], "rpc_trusted_network": True})
    with pytest.raises(ConfigError, match="cannot be combined with models or models_dir"):
        load_config(None, {"rpc_servers": [A], "rpc_trusted_network": True, "models_dir": str(tmp_path)})
    assert load_config(None, {"rpc_servers": ["[::1]:50052"], "rpc_trusted_network": True}).rpc_servers


def test_rpc_plan_with_auto_fit_takes_the_remote_devices_before_shrinking_the_context(
        models: dict[str, ModelInfo]) -> None:
    cfg = FleetConfig(rpc_servers=[A, B], rpc_trusted_network=True)  # parallel and context_length left to fit
    plan = make_plan(models["70b-q4_0"], one_gpu(), cfg)
    assert plan.fits and plan.replicas[0].rpc_servers == (A, B)
    assert "the largest auto-fit tries, fit" in plan.reasons[1]


def test_rpc_plan_keeps_a_local_rule_refusal_without_claiming_the_model_fits(models: dict[str, ModelInfo]) -> None:
    plan = make_plan(models["7b-q4_0"], one_gpu(), FleetConfig(**RPC, gpus=[3]))
    assert not plan.fits and any("gpus lists [3]" in x for x in plan.reasons)
    assert not any("rpc_servers are not used" in w for w in plan.warnings)
