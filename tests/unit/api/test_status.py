"""``GET /v1/status``'s document for a GPU plan, without GPUs: the demo model planned on an inventory file of two
24 GB GPUs, NVML samples given by hand, and a replica stopped by a crash."""

from __future__ import annotations

import json
from pathlib import Path

from llamafleet.api.service import Service
from llamafleet.api.status import Dashboard, status
from llamafleet.config import FleetConfig
from llamafleet.fleet.pace import Pace
from llamafleet.fleet.specs import plan_specs
from llamafleet.fleet.telemetry import GpuSample
from llamafleet.model.header import read_model_info
from llamafleet.placement.gpus import load_inventory
from llamafleet.placement.planner import make_plan
from one_model import one_model_service

ROOT = Path(__file__).resolve().parents[3]
GiB = 2**30


def _service(model_path: Path) -> Service:
    cfg = FleetConfig(parallel=4, context_length=512)
    plan = make_plan(read_model_info(model_path), load_inventory(ROOT / "examples/inventories/2x24gb-pcie.yaml"), cfg)
    svc = one_model_service("demo", plan_specs(plan, cfg, str(model_path)), cfg, plan=plan)
    svc.watchdog.gpus = [GpuSample(0, "RTX 4090", 3 * GiB, 24 * GiB, 40.0),
                         GpuSample(1, "RTX 4090", 2 * GiB, 24 * GiB, None),
                         GpuSample(2, "someone else's", 1 * GiB, 8 * GiB, 0.0)]
    return svc


def test_each_gpu_shows_its_planned_parts_next_to_what_is_measured(model_path: Path) -> None:
    dash = Dashboard(_service(model_path))
    doc = json.loads(json.dumps(status(dash, 0.0)))  # plain JSON all the way down
    gpu0, gpu1, other = doc["devices"]
    assert (gpu0["device"], gpu0["index"], [p["replicas"] for p in gpu0["planned"]]) == ("GPU 0", 0, [["0"]])
    assert [p["replicas"] for p in gpu1["planned"]] == [["1"]]
    part = gpu0["planned"][0]
    assert part["model"] == "demo" and part["weights_mib"] > 50 and part["kv_mib"] > 0 and part["compute_mib"] > 0
    assert gpu0["measured"] == {"used_bytes": 3 * GiB, "total_bytes": 24 * GiB, "utilization": 0.4}
    assert gpu1["measured"]["utilization"] is None
    # a GPU the plan did not use is still shown, measured only
    assert (other["device"], other["planned"], other["measured"]["total_bytes"]) == ("GPU 2", [], 8 * GiB)
    assert [r["gpus"] for r in doc["replicas"]] == [[0], [1]] and {r["model"] for r in doc["replicas"]} == {"demo"}
    (plan,) = doc["plans"]
    assert plan["model"] == "demo" and plan["device"] == "gpu" and plan["reasons"]
    assert doc["status"] == "loading" and doc["models"] == [{"name": "demo", "state": "loading", "pinned": True,
                                                             "n_ctx_per_seq": 512, "replicas": ["0", "1"]}]


def test_a_stopped_replica_goes_on_the_errors_list_once(model_path: Path) -> None:
    svc = _service(model_path)
    dash = Dashboard(svc)
    dash.sample()
    dispatcher = svc.model.dispatcher
    assert dispatcher is not None
    state = dispatcher.replicas.states[1]
    state.last_error, state.restarts = "worker exited (killed by SIGKILL)", 1
    dash.sample()
    dash.sample()
    doc = status(dash, 0.0)
    assert [(e["source"], e["message"]) for e in doc["recent"]["errors"]] == \
        [("replica 1", "worker exited (killed by SIGKILL)")]
    samples = doc["history"]["samples"]
    assert len(samples) == 3 and samples[-1]["gpus"][0] == {"index": 0, "used_bytes": 3 * GiB, "utilization": 0.4}


def test_what_slows_the_fleet_down_is_in_the_warnings(model_path: Path) -> None:
    dash = Dashboard(_service(model_path))
    assert status(dash, 0.0)["warnings"] == []
    dash.pace = Pace(cores=2, load=lambda: 5.0)  # a host as busy as the one of issue 30
    dash.sample()
    (warning,) = status(dash, 0.0)["warnings"]
    assert warning.startswith("the host's load (5.0, 1-minute average) exceeds its 2 cores")
