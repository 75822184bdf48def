"""Limits at admission: each limit refuses with its name and a Retry-After, takes nothing when it refuses, and
refills; over HTTP the refusals are OpenAI-style 429s, 403s and 404s, counted by key name."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from llamafleet.api.app import create_app
from llamafleet.engine.scheduler import BATCH
from llamafleet.engine.types import DEFAULT_PRIORITY
from llamafleet.tenants.keys import PRIORITY_CLASSES, Limits, Tenant, effective_priority, load_keyring
from llamafleet.tenants.limits import DAY_S, Limiter
from one_model import one_model_service

MODEL = "tiny-model"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _tenant(**limits: int) -> Tenant:
    return Tenant("t", frozenset({"inference"}), limits=Limits.model_validate(limits))


def test_requests_per_minute_is_a_bucket_of_a_minute_refilled_continuously() -> None:
    clock = Clock()
    limiter, t = Limiter(clock, clock), _tenant(requests_per_minute=60)
    assert all(limiter.admit(t) is None for _ in range(60))
    refusal = limiter.admit(t)
    assert refusal is not None and refusal.limit == "requests_per_minute" and refusal.retry_after_s == 1
    clock.t += 2.0  # two requests' worth
    assert limiter.admit(t) is None and limiter.admit(t) is None and limiter.admit(t) is not None


def test_tokens_count_as_used_and_refuse_while_the_bucket_is_empty() -> None:
    clock = Clock()
    limiter, t = Limiter(clock, clock), _tenant(tokens_per_minute=600)
    assert limiter.admit(t) is None
    limiter.charge(t, 900)  # a request may overshoot: it was admitted with tokens left
    refusal = limiter.admit(t)
    assert refusal is not None and refusal.limit == "tokens_per_minute" and refusal.retry_after_s == 31
    clock.t += 31
    assert limiter.admit(t) is None


def test_tokens_per_day_reset_at_midnight_utc() -> None:
    clock = Clock()
    clock.t = 10 * DAY_S + DAY_S - 100  # 100 s before midnight
    limiter, t = Limiter(clock, clock), _tenant(tokens_per_day=1000)
    limiter.charge(t, 1000)
    refusal = limiter.admit(t)
    assert refusal is not None and refusal.limit == "tokens_per_day" and refusal.retry_after_s == 100
    clock.t += 100
    assert limiter.admit(t) is None


def test_concurrent_counts_requests_in_flight_and_a_refusal_takes_nothing() -> None:
    clock = Clock()
    limiter, t = Limiter(clock, clock), _tenant(concurrent=2, requests_per_minute=3)
    assert limiter.admit(t) is None and limiter.admit(t) is None
    refusal = limiter.admit(t)
    assert refusal is not None and refusal.limit == "concurrent"
    limiter.release(t)
    assert limiter.admit(t) is None  # the third request of the minute: the concurrent refusal took none
    limiter.release(t)
    assert (r := limiter.admit(t)) is not None and r.limit == "requests_per_minute"


KEYS = """\
keys:
  - {name: chat, key: k-chat, scopes: [inference], models: ["chat*"]}
  - {name: bulk, key: k-bulk, scopes: [inference], priority: batch, limits: {requests_per_minute: 2}}
  - {name: prom, key: k-prom, scopes: [metrics]}
  - {name: root, key: k-root, scopes: [admin]}
"""


def _client(tmp_path: Path) -> TestClient:
    path = tmp_path / "keys.yaml"
    path.write_text(KEYS, encoding="utf-8")
    service = one_model_service(MODEL, keys=load_keyring(str(path), environ={}))
    return TestClient(create_app(service, on_ready=lambda: None, on_fatal=lambda _m: None))


def _post(client: TestClient, key: str, path: str = "/v1/completions") -> tuple[int, dict[str, str], dict]:  # type: ignore[type-arg]
    r = client.post(path, json={"model": MODEL, "prompt": "hi", "max_tokens": 4},
                    headers={"Authorization": f"Bearer {key}"})
    return r.status_code, dict(r.headers), r.json()


def test_refusals_over_http_name_the_limit_scope_or_hide_the_model(tmp_path: Path) -> None:
    client = _client(tmp_path)
    status, _, body = _post(client, "k-chat")
    assert status == 404 and body["error"]["code"] == "model_not_found"  # not its model: as if it did not exist
    assert f"'{MODEL}'" not in body["error"]["message"].split("serves")[1]
    assert client.get("/v1/models", headers={"Authorization": "Bearer k-chat"}).json()["data"] == []
    assert client.get("/v1/models", headers={"Authorization": "Bearer k-bulk"}).json()["data"][0]["id"] == MODEL
    status, _, body = _post(client, "k-prom")
    assert status == 403 and body["error"]["type"] == "permission_error" and body["error"]["param"] == "inference"
    assert "'inference' scope" in body["error"]["message"]
    assert _post(client, "k-bulk")[0] == 503 and _post(client, "k-bulk")[0] == 503  # admitted (no replica here)
    status, headers, body = _post(client, "k-bulk")
    assert status == 429 and headers["retry-after"] == "30"
    assert body["error"] == {"message": body["error"]["message"], "type": "rate_limit_error",
                             "param": "requests_per_minute", "code": "rate_limit_exceeded"}
    assert "requests_per_minute: 2" in body["error"]["message"] and "'bulk'" in body["error"]["message"]
    anthropic = client.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": []},
                            headers={"x-api-key": "k-bulk"})
    assert anthropic.status_code == 429 and anthropic.json()["error"]["type"] == "rate_limit_error"
    assert client.post(f"/admin/models/{MODEL}/unload", headers={"Authorization": "Bearer k-chat"}).status_code == 403
    metrics = client.get("/metrics", headers={"Authorization": "Bearer k-prom"}).text
    assert 'llamafleet_key_refused_total{key="bulk",limit="requests_per_minute"} 2' in metrics
    assert 'llamafleet_key_refused_total{key="chat",limit="model"} 1' in metrics
    assert 'llamafleet_key_refused_total{key="prom",limit="scope"} 1' in metrics
    assert 'llamafleet_key_requests_total{key="bulk"} 2' in metrics and "k-bulk" not in metrics


def test_a_request_may_ask_for_a_lower_class_never_a_better_one() -> None:
    assert PRIORITY_CLASSES[DEFAULT_PRIORITY] == "default" and PRIORITY_CLASSES[BATCH] == "batch"  # the engine's
    assert [effective_priority(0, r) for r in (None, -5, 0, 1, 2, 99)] == [0, 0, 0, 1, 2, 2]  # an interactive key
    assert [effective_priority(2, r) for r in (None, 0, 1)] == [2, 2, 2]  # a batch key stays batch
    assert [effective_priority(None, r) for r in (None, 0, 2)] == [1, 1, 2]  # a plain key, or none: default or lower


def test_the_priority_field_is_taken_by_both_completion_routes() -> None:
    client = TestClient(create_app(one_model_service(MODEL), on_ready=lambda: None, on_fatal=lambda _m: None))
    for path, body in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": [
            {"role": "user", "content": "hi"}]})):
        ok = client.post(path, json={"model": MODEL, "max_tokens": 4, "priority": 2, **body})
        assert ok.status_code == 503  # accepted (no replica runs in this test)
        bad = client.post(path, json={"model": MODEL, "max_tokens": 4, "priority": "high", **body})
        assert bad.status_code == 400 and "'priority'" in bad.json()["error"]["message"]
