"""The dashboard (``/ui``) and its numbers (``GET /v1/status``), against a real server with API keys on, used as a
person would: headless Chromium opens the page, gets the key pasted in, watches the numbers move under load, chats
in the playground and reads the streamed answer, and takes the screenshot the docs show.

``LLAMAFLEET_DOCS_SCREENSHOT=1`` also writes the screenshot to docs/img/dashboard.png (256 colours, to stay small).
"""

from __future__ import annotations

import concurrent.futures
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import Browser
from openai import OpenAI
from scrape import metric

from conftest import FleetServer

KEY = "dashboard-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard.png"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def keyed(launch_fleet: Callable[[list[str]], FleetServer], model_path: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetServer]:
    """The demo model, 2 replicas x 4 slots, with an API key required; stopped after this module's tests."""
    folder = tmp_path_factory.mktemp("keyed")
    (folder / "keys").write_text(f"{KEY}\n", encoding="utf-8")
    (folder / "fleet.yaml").write_text(f"api_keys_file: {folder / 'keys'}\n", encoding="utf-8")
    server = launch_fleet(["--config", str(folder / "fleet.yaml"), "--model", str(model_path), "--replicas", "2",
                           "--parallel", "4", "--ctx", "512", "--threads", "1"])
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture
def client(keyed: FleetServer) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{keyed.url}/v1", api_key=KEY, max_retries=0, timeout=120.0) as c:
        yield c


def status(server: FleetServer, **params: Any) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/v1/status", headers=AUTH, params=params, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_status_needs_the_key_and_has_the_numbers_of_metrics(keyed: FleetServer, client: OpenAI,
                                                             model_path: Path) -> None:
    assert httpx.get(f"{keyed.url}/v1/status", timeout=30).status_code == 401
    assert httpx.get(f"{keyed.url}/v1/status", headers={"Authorization": "Bearer wrong"}, timeout=30).status_code \
        == 401
    answers = [client.chat.completions.create(model=keyed.model(), max_tokens=12, temperature=0,
                                              messages=[{"role": "user", "content": f"Count to {n}"}])
               for n in (3, 4)]
    assert httpx.get(f"{keyed.url}/v1/nowhere", timeout=30).status_code == 401  # a stranger knocking

    s = status(keyed)
    text = httpx.get(f"{keyed.url}/metrics", headers=AUTH, timeout=30).text
    totals = s["totals"]
    assert totals["generated_tokens"] == metric(text, "llamafleet_generated_tokens_total") \
        == sum(a.usage.completion_tokens for a in answers if a.usage)
    assert totals["prompt_tokens"] == metric(text, "llamafleet_prompt_tokens_total")
    assert totals["ttft_s"] is not None and totals["itl_s"] is not None
    assert s["status"] == "ready" and [m["name"] for m in s["models"]] == [keyed.model()]
    for r in s["replicas"]:
        assert r["model"] == keyed.model() and r["where"] == "CPU" and r["status"] == "ready"
        assert r["slots"] == metric(text, "llamafleet_replica_slots", replica=str(r["index"])) == 4
        assert r["restarts"] == metric(text, "llamafleet_replica_restarts_total", replica=str(r["index"]))
        n_ttft = metric(text, "llamafleet_time_to_first_token_seconds_count", replica=str(r["index"]))
        assert (r["ttft_s"] is None) == (n_ttft == 0)
    (plan,) = s["plans"]
    assert plan["fits"] and plan["reasons"] and plan["model"] == keyed.model()
    (cpu,) = s["devices"]
    assert cpu["device"] == "CPU" and cpu["planned"][0]["replicas"] == ["0", "1"]
    assert cpu["planned"][0]["weights_mib"] > 50 and cpu["measured"]["used_bytes"] > 50 * 2**20

    chats = [e for e in s["recent"]["requests"] if e["route"] == "/v1/chat/completions"]
    assert [(e["method"], e["status"], e["completion_tokens"]) for e in chats[:2]] == \
        [("POST", 200, a.usage.completion_tokens) for a in reversed(answers) if a.usage]
    assert all(e["request_body"] is None and e["response_body"] is None for e in chats)  # contents are off
    assert not s["recent"]["contents"]
    assert not any(e["route"] == "/v1/status" for e in s["recent"]["requests"])  # its own polling is not listed
    assert s["recent"]["errors"][0]["status"] == 401 and "missing API key" in s["recent"]["errors"][0]["message"]

    samples = s["history"]["samples"]
    assert samples and s["history"]["interval_s"] == 1.0
    assert all(x["t"] > samples[-1]["t"] for x in status(keyed, since=samples[-1]["t"])["history"]["samples"])
    bad = httpx.get(f"{keyed.url}/v1/status", headers=AUTH, params={"since": "yesterday"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"


def test_the_page_is_open_but_its_data_is_not(keyed: FleetServer) -> None:
    page = httpx.get(f"{keyed.url}/ui", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    for name in ("dashboard.js", "playground.js", "common.js", "dashboard.css"):
        assert httpx.get(f"{keyed.url}/ui/{name}", timeout=30).status_code == 200
    assert httpx.get(f"{keyed.url}/ui/nothing.js", timeout=30).status_code == 404
    assert httpx.get(f"{keyed.url}/ui/..%2Fv1%2Fstatus", timeout=30).status_code == 404
    assert httpx.get(f"{keyed.url}/ui/../v1/status", timeout=30).status_code in (401, 404)


def _load(client: OpenAI, model: str, n: int) -> list[int]:
    """``n`` chats at once (16 at a time: more than the 8 slots, so some queue); their completion token counts."""
    def one(i: int) -> int:
        r = client.chat.completions.create(model=model, max_tokens=48, temperature=0.8, seed=i,
                                           messages=[{"role": "user", "content": f"Tell a story about the number {i}"}])
        return r.usage.completion_tokens if r.usage else 0

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return list(pool.map(one, range(n)))


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_a_person_watches_the_fleet_and_chats_in_the_playground(keyed: FleetServer, client: OpenAI,
                                                                 tmp_path: Path) -> None:
    with Browser(tmp_path / "chromium") as b:
        b.goto(f"{keyed.url}/ui")
        # no key yet: the page says so instead of showing numbers
        b.wait_for("document.getElementById('server-status').textContent === 'needs a key'")
        assert "API key" in b.text("#banner")
        b.type("#key-input", KEY)
        b.click("#key-form button[type=submit]")
        b.wait_for("document.getElementById('server-status').textContent === 'ready'")
        assert KEY not in b.eval("location.href") and b.eval("sessionStorage.getItem('llamafleet.apiKey')") == KEY
        b.wait_for("document.querySelectorAll('#replicas tbody tr .state-ready').length === 2")
        assert "Smollm2" in b.text("#plans") or "CPU plan" in b.text("#plans")
        assert "weights" in b.text("#devices") and b.eval("document.querySelectorAll('.bar .weights').length") == 1
        requests_before = int(b.text("#http-requests").replace(",", ""))

        # under load the live numbers move: tokens/s, busy slots, the per-replica sparklines
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            load = pool.submit(_load, client, keyed.model(), 32)
            b.wait_for("parseFloat(document.getElementById('tokens-per-s').textContent) > 0")
            b.wait_for("parseInt(document.getElementById('queue-depth').textContent) > 0")  # 16 chats, 8 slots
            b.wait_for("[...document.querySelectorAll('#replicas .slots')].some(td => !td.textContent.startsWith('0'))")
            generated = sum(load.result(timeout=300))
        b.wait_for("document.getElementById('tokens-per-s').textContent === '0'", timeout=20)  # and settle again
        assert b.eval("document.querySelectorAll('#replicas svg.spark polyline').length") > 0
        b.wait_for(f"parseInt(document.getElementById('http-requests').textContent.replace(/,/g, '')) >= "
                   f"{requests_before + 32}")
        assert generated > 0
        rows = b.eval("[...document.querySelectorAll('#recent tbody tr')].map(tr => tr.textContent)")
        assert sum("/v1/chat/completions" in r and "200" in r for r in rows) >= 32

        # the playground: greedy settings, a question, the answer streamed in pieces
        b.eval("document.getElementById('set-temperature').value = ''")
        b.type("#set-temperature", "0")
        b.eval("document.getElementById('set-max-tokens').value = ''")
        b.type("#set-max-tokens", "40")
        b.eval("window.pieces = 0; new MutationObserver(() => window.pieces++).observe("
               "document.getElementById('chat-log'), {subtree: true, childList: true, characterData: true})")
        b.type("#chat-input", "What is the capital of France?")
        b.click("#chat-send")
        answer = b.wait_for("document.querySelector('.msg.assistant.done .text')?.textContent", timeout=60)
        raw = b.text("#raw-request")
        assert '"stream": true' in raw and "What is the capital of France?" in raw and '"max_tokens": 40' in raw
        assert "Authorization: Bearer <your key>" in raw and KEY not in raw
        assert b.eval("window.pieces") > 3  # the text grew piece by piece
        assert "tokens/s" in b.text("#chat-stats")
        same = client.chat.completions.create(model=keyed.model(), temperature=0, max_tokens=40,
                                              messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert answer == same.choices[0].message.content

        b.wait_for("[...document.querySelectorAll('#replicas .slots')].every(td => td.textContent.startsWith('0'))")
        png = b.screenshot(tmp_path / "dashboard.png")
        width, height = _png_size(png)
        assert width == 1400 and height > 1000
        assert b.errors == []
    if os.environ.get("LLAMAFLEET_DOCS_SCREENSHOT"):
        from PIL import Image

        Image.open(tmp_path / "dashboard.png").convert("RGB").quantize(256).save(DOCS_IMG, optimize=True)
