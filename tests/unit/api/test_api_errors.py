"""What the API tells a client when the server fails, and what ``/ready`` shows to whom. The app runs with its replicas
never started; the failing routes are real routes added to the real app."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

from llamafleet.api.aggregate import client_error
from llamafleet.api.app import create_app
from llamafleet.fleet.dispatch import Failure
from one_model import one_model_service

SECRET = "connection to db-7.internal:5432 refused"
ERROR_ID = re.compile(r"err-[0-9a-f]{16}")


def _app(api_keys: frozenset[str] = frozenset()) -> FastAPI:
    service = one_model_service("tiny-model", api_keys=api_keys)
    return create_app(service, on_ready=lambda: None, on_fatal=lambda _m: None)


@pytest.fixture
def client() -> TestClient:
    app = _app()

    @app.get("/crash")
    async def crash() -> None:
        raise RuntimeError(SECRET)

    @app.get("/crash-mid-stream")
    async def crash_mid_stream() -> StreamingResponse:
        def events() -> Iterator[str]:
            yield "data: {}\n\n"
            raise RuntimeError(SECRET)
        return StreamingResponse(events(), media_type="text/event-stream")

    return TestClient(app)


def _logged_id(caplog: pytest.LogCaptureFixture) -> str:
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.exc_info is not None and SECRET in str(record.exc_info[1])  # the traceback is in the log
    found = ERROR_ID.search(record.getMessage())
    assert found
    return found.group(0)


def test_a_crash_is_a_500_with_an_error_id_and_no_internals(client: TestClient,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    r = client.get("/crash")
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert SECRET not in r.text and "RuntimeError" not in r.text
    assert _logged_id(caplog) in error["message"]


def test_a_stream_that_crashes_ends_with_an_error_event_and_done(client: TestClient,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    r = client.get("/crash-mid-stream")
    events = [line for line in r.text.splitlines() if line]
    assert events[0] == "data: {}" and events[-1] == "data: [DONE]", events
    assert '"internal_error"' in events[-2] and SECRET not in r.text
    assert _logged_id(caplog) in events[-2]


def test_a_worker_failure_reaches_the_client_as_an_error_id(caplog: pytest.LogCaptureFixture) -> None:
    error = client_error(Failure(500, f"RuntimeError: {SECRET}\n"), "cmpl-1-0")
    assert error.status == 500 and SECRET not in error.message
    (record,) = caplog.records
    found = ERROR_ID.search(error.message)
    assert found and found.group(0) in record.getMessage()
    assert "cmpl-1-0" in record.getMessage() and "\\n" in record.getMessage()  # one line, the text repr'd
    assert client_error(Failure(503, "replica 0 is restarting"), "x").message == "replica 0 is restarting"


def test_ready_shows_details_to_operators_only() -> None:
    detail = {"pid", "load_fraction", "outstanding", "generated_tokens", "last_error"}
    (open_replica,) = TestClient(_app()).get("/ready").json()["replicas"]  # no keys: everyone is an operator
    assert detail <= set(open_replica)
    locked = TestClient(_app(frozenset({"k"})))
    for headers in ({}, {"Authorization": "Bearer nope"}):
        r = locked.get("/ready", headers=headers)
        assert r.status_code == 503 and r.json()["status"] == "loading"
        (replica,) = r.json()["replicas"]
        assert not detail & set(replica) and {"status", "where", "slots", "slots_busy", "restarts"} <= set(replica)
    (replica,) = locked.get("/ready", headers={"Authorization": "Bearer k"}).json()["replicas"]
    assert detail <= set(replica)
