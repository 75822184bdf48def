"""Limits decided in the API process alone: queue bounds in the router, slot-leak detection, API keys, body size,
CORS, and max_tokens against the context. The app runs with its replicas never started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from llamafleet.api.app import create_app
from llamafleet.config import FleetConfig
from llamafleet.engine.types import EngineStats
from llamafleet.fleet.router import QueueFullError, Router
from llamafleet.fleet.snapshot import ReplicaView
from llamafleet.fleet.watchdog import leaking
from llamafleet.tenants.keys import ApiKeysError, load_api_keys
from one_model import one_model_service

MODEL = "tiny-model"


def test_router_bounds_each_replica_queue_and_the_total() -> None:
    r = Router(2, max_queue_per_replica=1, max_queue=1)
    r.set_up(0, 1)
    r.set_up(1, 1)
    placed = [r.assign(f"s{i}") for i in range(3)]  # two slots, then one waiting (the total bound)
    assert sorted(placed) == [0, 0, 1] or sorted(placed) == [0, 1, 1]
    assert r.queue_depth() == 1
    with pytest.raises(QueueFullError, match="1 sequence"):
        r.assign("s3")
    r.release("s0")
    r.assign("s3")  # room again


def test_router_per_replica_bound_sends_work_elsewhere() -> None:
    r = Router(2, "round_robin", max_queue_per_replica=0)
    r.set_up(0, 1)
    r.set_up(1, 2)
    assert [r.assign(f"s{i}") for i in range(3)] == [0, 1, 1]
    with pytest.raises(QueueFullError):
        r.assign("s3")


def _replica(index: int, busy: int, outstanding: int) -> ReplicaView:
    return ReplicaView(id=str(index), index=index, model=MODEL, where="CPU", status="ready", outstanding=outstanding,
                       stats=EngineStats(slots_total=4, slots_busy=busy, waiting=0, kv_tokens_used=0,
                                         kv_tokens_total=2048, steps=1, prompt_tokens_total=0, generated_tokens_total=0,
                                         decode_seconds_total=0.0, step_seconds_total=0.0, sample_seconds_total=0.0))


def test_leak_is_reported_after_it_lasts_and_only_with_nothing_in_flight() -> None:
    replicas = [_replica(0, 1, 1), _replica(1, 2, 0)]  # replica 0 has a request in flight; replica 1 has none
    since: dict[str, float] = {}
    assert leaking(replicas, since, now=100.0, leak_s=30.0) == []
    assert leaking(replicas, since, now=129.0, leak_s=30.0) == []
    assert leaking(replicas, since, now=130.0, leak_s=30.0) == [replicas[1]]
    assert "1" not in since  # reported once, then watched afresh
    replicas[1] = _replica(1, 0, 0)
    assert leaking(replicas, since, now=200.0, leak_s=30.0) == [] and since == {}


def _client(api_keys: frozenset[str] = frozenset(), admin_keys: frozenset[str] = frozenset(),
            **config: Any) -> TestClient:
    cfg = FleetConfig.model_validate(config)
    service = one_model_service(MODEL, cfg=cfg, api_keys=api_keys, admin_keys=admin_keys)
    return TestClient(create_app(service, on_ready=lambda: None, on_fatal=lambda _m: None))


def test_api_keys_guard_everything_but_the_probes() -> None:
    client = _client(frozenset({"k1", "k2"}))
    missing = client.get("/v1/models")
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
    assert missing.headers["www-authenticate"] == "Bearer"
    assert client.get("/v1/models", headers={"Authorization": "Bearer k3"}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "bearer k2"}).status_code == 200
    assert client.get("/health").status_code == 200
    assert client.get("/metrics").status_code == 401
    assert "llamafleet_http_requests_total" in client.get("/metrics", headers={"Authorization": "Bearer k1"}).text


def test_admin_routes_take_only_admin_keys() -> None:
    unload = f"/admin/models/{MODEL}/unload"
    off = _client(frozenset({"k1"})).post(unload, headers={"Authorization": "Bearer k1"})
    assert off.status_code == 403 and "admin_api_keys_file" in off.json()["error"]["message"]
    assert _client().post(unload).status_code == 403  # no keys at all: the admin routes stay closed
    client = _client(frozenset({"k1"}), frozenset({"root"}))
    assert client.post(unload, headers={"Authorization": "Bearer k1"}).status_code == 401  # an API key is not one
    pinned = client.post(unload, headers={"Authorization": "Bearer root"})  # a lone model is pinned
    assert pinned.status_code == 409 and pinned.json()["error"]["code"] == "model_pinned"
    assert client.get("/v1/models", headers={"Authorization": "Bearer root"}).status_code == 200  # and it is one
    open_api = _client(admin_keys=frozenset({"root"}))  # admin keys alone leave the API open, as before
    card = open_api.get("/v1/models").json()["data"][0]
    assert card["id"] == MODEL and card["pinned"] and card["state"] == "loading" and card["where"] == ["CPU"]


def test_body_limit_gives_413_announced_or_chunked() -> None:
    client = _client(max_body_bytes=2048)
    body = b'{"model": "tiny-model", "prompt": "' + b"a" * 4096 + b'"}'
    r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "2048 bytes" in r.json()["error"]["message"]
    chunked = client.post("/v1/completions", content=iter([body[:1000], body[1000:]]),
                          headers={"content-type": "application/json"})
    assert chunked.status_code == 413


def test_max_tokens_beyond_the_context_is_refused_before_queueing() -> None:
    r = _client().post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 512})
    assert r.status_code == 400 and "max_tokens (512)" in r.text and "(512)" in r.text


def test_cors_is_off_unless_configured() -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in _client().options("/v1/completions", headers=preflight).headers
    on = _client(cors_origins=["https://app.example"]).options("/v1/completions", headers=preflight)
    assert on.headers["access-control-allow-origin"] == "https://app.example"


def test_keys_load_from_env_and_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# ops\nk-file  # the CI key\n\n", encoding="utf-8")
    assert load_api_keys(str(keys), {"LLAMAFLEET_API_KEYS": "a, b,,"}) == {"a", "b", "k-file"}
    assert load_api_keys(None, {}) == frozenset()
    assert load_api_keys(None, {"LLAMAFLEET_ADMIN_API_KEYS": "r"}, "LLAMAFLEET_ADMIN_API_KEYS") == {"r"}
    with pytest.raises(ApiKeysError, match="cannot be read"):
        load_api_keys(str(tmp_path / "missing"), {})
    (tmp_path / "empty").write_text("# none\n", encoding="utf-8")
    with pytest.raises(ApiKeysError, match="holds no key"):
        load_api_keys(str(tmp_path / "empty"), {})


def test_watchdog_refuses_only_for_the_fleets_own_gpus() -> None:
    from llamafleet.fleet.telemetry import GpuSample
    from llamafleet.fleet.watchdog import fleet_gpus, refusal

    gpus = [ReplicaView(id="0", index=0, model=MODEL, where="GPUs 1,2", status="ready", gpus=(1, 2)),
            ReplicaView(id="1", index=1, model=MODEL, where="GPU 3", status="down", gpus=(3,))]
    assert fleet_gpus(gpus) == {1, 2, 3}
    assert fleet_gpus([ReplicaView(id="0", index=0, model=MODEL, where="CPU", status="ready")]) == set()
    gib = 2**30
    full_other = GpuSample(0, "H200", 140 * gib, 140 * gib + 100 * 2**20, None)  # 100 MiB free, not ours
    roomy = GpuSample(1, "H200", 10 * gib, 140 * gib, None)
    assert refusal([full_other, roomy], {1, 2, 3}, 256) is None
    full_ours = GpuSample(3, "H200", 140 * gib, 140 * gib + 100 * 2**20, None)
    expected = "GPU 3 has 100 MiB free (vram_refuse_free_mib 256)"
    assert refusal([full_other, roomy, full_ours], {1, 2, 3}, 256) == expected
