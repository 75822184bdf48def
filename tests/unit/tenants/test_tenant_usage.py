"""Usage per key and UTC day: counted by name, kept across restarts in SQLite, read by admins at /v1/usage."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from llamafleet.api.app import create_app
from llamafleet.fleet.telemetry import FleetMetrics
from llamafleet.tenants.keys import load_keyring
from llamafleet.tenants.tenancy import Tenancy
from llamafleet.tenants.usage import Usage
from one_model import one_model_service

DAY = 20_000 * 86400.0  # 2024-10-04, UTC


def test_usage_survives_a_restart_in_its_sqlite_file(tmp_path: Path) -> None:
    db = str(tmp_path / "usage.sqlite")
    first = Usage(FleetMetrics(), wall=lambda: DAY + 10)
    first.open(db)
    first.admitted("agents")
    first.used("agents", 100, 40, 0)
    first.used("agents", 0, 0, 7)
    first.refusal("agents", "tokens_per_minute")
    first.close()
    again = Usage(FleetMetrics(), wall=lambda: DAY + 86400 + 10)  # the next day
    again.open(db)
    again.admitted("agents")
    assert again.report("agents") == [
        {"key": "agents", "day": "2024-10-04", "requests": 1, "prompt_tokens": 100, "cached_tokens": 40,
         "completion_tokens": 7, "refused": 1},
        {"key": "agents", "day": "2024-10-05", "requests": 1, "prompt_tokens": 0, "cached_tokens": 0,
         "completion_tokens": 0, "refused": 0}]
    again.close()


def test_the_usage_route_is_for_admins_and_filters_by_key_and_day(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - {name: a, key: k-a}\n  - {name: root, key: k-root, scopes: [admin]}\n",
                    encoding="utf-8")
    service = one_model_service("tiny-model", keys=load_keyring(str(keys), environ={}))
    service.tenancy.usage.admitted("a")
    client = TestClient(create_app(service, on_ready=lambda: None, on_fatal=lambda _m: None))
    root = {"Authorization": "Bearer k-root"}
    assert client.get("/v1/usage", headers={"Authorization": "Bearer k-a"}).status_code == 403
    (row,) = client.get("/v1/usage?key=a", headers=root).json()["data"]
    assert row["key"] == "a" and row["requests"] == 1
    assert client.get("/v1/usage?day=1999-01-01", headers=root).json()["data"] == []
    assert client.get("/v1/usage?day=yesterday", headers=root).status_code == 400
    assert client.get("/v1/usage?key=b", headers=root).status_code == 404


def test_a_usage_file_that_cannot_be_opened_leaves_usage_in_memory(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "blocker").write_text("a file, not a folder", encoding="utf-8")
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"usage_file: {tmp_path / 'blocker' / 'usage.sqlite'}\nkeys:\n  - {{name: a, key: k}}\n",
                    encoding="utf-8")
    tenancy = Tenancy(load_keyring(str(keys), environ={}), FleetMetrics())
    tenancy.usage.admitted("a")
    tenancy.usage.flush()
    assert tenancy.usage.report("a")[0]["requests"] == 1 and "kept in memory only" in caplog.text
