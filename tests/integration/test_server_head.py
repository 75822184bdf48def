"""What uptime monitors and new users send: HEAD on every GET route (answered like the GET, without a body, and not
an error on the dashboard), and a misspelt request parameter, which the SDKs' users see with its nearest name."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from conftest import FleetServer
from llamafleet.api.app import create_app
from one_model import one_model_service

pytestmark = pytest.mark.each_engine

# GET routes of the server, with a path that exists on the shared server ({model} filled in)
GET_PATHS = ("/health", "/ready", "/metrics", "/v1/models", "/v1/models/{model}", "/v1/status", "/ui",
             "/ui/dashboard.js", "/openapi.json", "/docs")


def test_every_get_route_of_the_app_takes_head() -> None:
    """Every GET route the app documents (so a route added later is covered without a line here) answers HEAD with
    the GET's status and no body; the app is not started: the routes answer from the service as it is."""
    app = create_app(one_model_service("demo"), lambda: None, lambda _: None)
    paths = [p for p, ops in app.openapi()["paths"].items() if "get" in ops] + ["/ui", "/ui/dashboard.js", "/docs"]
    assert {"/health", "/ready", "/metrics", "/v1/models", "/v1/status"} <= set(paths)
    client = TestClient(app)
    for path in paths:
        url = path.replace("{model_id}", "demo")
        got, head = client.get(url), client.head(url)
        assert head.status_code == got.status_code != 405, (path, head.status_code, got.status_code)
        assert head.content == b"" and head.headers.get("content-type") == got.headers.get("content-type"), path
    assert client.head("/v1/chat/completions").status_code == 405  # a POST route stays a POST route


def test_head_answers_like_get_without_a_body_and_is_no_error(fleet: FleetServer, model: str) -> None:
    for path in GET_PATHS:
        url = fleet.url + path.format(model=model)
        got, head = httpx.get(url, timeout=30), httpx.head(url, timeout=30)
        assert head.status_code == got.status_code == 200, (path, head.status_code, got.status_code)
        assert head.content == b"", path
        assert head.headers["content-type"] == got.headers["content-type"], path
    status = httpx.get(f"{fleet.url}/v1/status", timeout=30).json()
    heads = [r for r in status["recent"]["requests"] if r["method"] == "HEAD"]
    assert heads and all(r["status"] == 200 and r["error"] is None for r in heads)
    assert not [e for e in status["recent"]["errors"] if "HEAD" in e["message"]]
    metrics = httpx.get(f"{fleet.url}/metrics", timeout=30).text
    assert 'method="HEAD",status="405"' not in metrics and 'method="HEAD",status="200"' in metrics


def test_a_misspelt_parameter_gets_the_nearest_name(client: OpenAI, fleet: FleetServer, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"max_token": 4})
    assert "unknown or unsupported parameter 'max_token': did you mean 'max_tokens'?" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model, input="hi", extra_body={"max_tokens": 4})
    assert "did you mean 'max_output_tokens'?" in str(e.value)
    claude = anthropic.Anthropic(base_url=fleet.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as ae:
        claude.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                               extra_body={"stop_sequence": ["x"]})
    assert "did you mean 'stop_sequences'?" in str(ae.value)
