"""Several models behind one real server, on the CPU: the demo model (pinned) and three synthetic tiny models of
different sizes, placed on a described 400 MiB GPU that cannot hold them all, so that loads evict. Concurrent
requests for every model (and an alias) while they load and evict: all answered by the right model, nothing lost,
never two loads at once; the idle TTL; llama-server's token routes and ``/props`` by model name; the bounded wait
for a load (503 + Retry-After); the admin routes and their keys; ``/v1/models`` and the per-model metrics;
``--models-dir``."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from scrape import metric

from conftest import FleetServer
from llamafleet.model.synth import SHAPES, find_vocab, write_model

ADMIN = "admin-test-key"
# demo 215 MiB, q4 73, q8 78, f16 95 at 2 slots x 512 tokens: any three fit in 400 MiB with demo, never all four
INVENTORY = "gpus:\n  - {name: test GPU, total_mib: 400}\n"
CHAT = {"max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tiny-models")
    vocab = find_vocab()
    return {q: write_model(folder / f"tiny-{q}.gguf", SHAPES["tiny"], q, vocab, progress=False)
            for q in ("q4_0", "q8_0", "f16")}


def unknown_tokenizer(gguf: bytes) -> bytes:
    """The model with its tokenizer renamed: the planner reads it, llama.cpp refuses to load it."""
    key = b"tokenizer.ggml.model"
    at = gguf.index(key) + len(key) + 4 + 8  # then the value's type (uint32) and length (uint64): "llama"
    assert gguf[at:at + 5] == b"llama"
    return gguf[:at] + b"nope!" + gguf[at + 5:]


def write_config(folder: Path, body: str) -> tuple[Path, Path]:
    (folder / "inventory.yaml").write_text(INVENTORY, encoding="utf-8")
    (folder / "fleet.yaml").write_text("vram_margin_mib: 0\nparallel: 2\ncontext_length: 512\nthreads: 1\n" + body,
                                       encoding="utf-8")
    return folder / "fleet.yaml", folder / "inventory.yaml"


@pytest.fixture(scope="module")
def server(launch_fleet: Callable[[list[str]], FleetServer], tiny: dict[str, Path], model_path: Path,
           tmp_path_factory: pytest.TempPathFactory) -> FleetServer:
    config, inventory = write_config(tmp_path_factory.mktemp("fleet"), (
        "models:\n"
        f"  - {{name: demo, path: {model_path}, pinned: true}}\n"
        f"  - {{name: q4, path: {tiny['q4_0']}, aliases: [small]}}\n"
        f"  - {{name: q8, path: {tiny['q8_0']}}}\n"
        f"  - {{name: f16, path: {tiny['f16']}}}\n"
        f"  - {{name: short-lived, path: {tiny['q4_0']}, idle_ttl_s: 2}}\n"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLAMAFLEET_ADMIN_API_KEYS", ADMIN)  # read by the server at start-up
        fleet = launch_fleet(["--config", str(config), "--inventory", str(inventory)])
    fleet.wait_ready()
    return fleet


def models(server: FleetServer) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]}


def chat(server: FleetServer, model: str, **extra: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", json={"model": model, **CHAT, **extra}, timeout=120)


def admin(server: FleetServer, name: str, verb: str, key: str | None = ADMIN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.url}/admin/models/{name}/{verb}", headers=headers, timeout=120)


def test_models_list_every_configured_model_with_its_state(server: FleetServer) -> None:
    listed = models(server)
    assert list(listed) == ["demo", "q4", "q8", "f16", "short-lived"]
    assert listed["demo"]["state"] == "loaded" and listed["demo"]["pinned"] and listed["demo"]["where"] == ["GPU 0"]
    assert listed["q4"]["aliases"] == ["small"] and listed["q4"]["context_length"] == 512
    assert httpx.get(f"{server.url}/v1/models/small", timeout=10).json()["id"] == "q4"
    missing = chat(server, "nope")
    assert missing.status_code == 404 and "'demo', 'q4', 'q8', 'f16', 'short-lived'" in missing.text


def test_concurrent_requests_for_every_model_load_and_evict_and_lose_nothing(server: FleetServer) -> None:
    answers: list[tuple[str, int, dict[str, Any]]] = []
    lock = threading.Lock()

    def ask(model: str, max_tokens: int) -> None:
        r = chat(server, model, max_tokens=max_tokens)
        with lock:
            answers.append((model, r.status_code, r.json()))

    names = ["q4", "q8", "f16", "demo", "small"] * 3
    threads = [threading.Thread(target=ask, args=(name, 32 if i % 4 == 0 else 4)) for i, name in enumerate(names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(answers) == len(names)
    for model, status, body in answers:
        assert status == 200, (model, body)
        assert body["model"] == ("q4" if model == "small" else model)
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert sum(metric(text, "llamafleet_model_evictions_total", model=m, reason="lru") for m in ("q4", "q8", "f16"))
    assert metric(text, "llamafleet_model_requests_total", model="q4") == 6  # "small" is q4
    assert metric(text, "llamafleet_model_load_seconds_count", model="f16") >= 1
    loaded = [m for m, v in models(server).items() if v["state"] == "loaded"]
    assert "demo" in loaded and len(loaded) <= 3  # never all four: they do not fit the 400 MiB GPU together
    # the status page tells the models' replicas apart by the labels /metrics uses, and plans each loaded one
    status = httpx.get(f"{server.url}/v1/status", timeout=10).json()
    assert [m["name"] for m in status["models"]] == ["demo", "q4", "q8", "f16", "short-lived"]
    ids = {r["id"]: r["model"] for r in status["replicas"]}
    assert ids["demo/0"] == "demo" and all(i == f"{m}/0" for i, m in ids.items())
    for r in status["replicas"]:
        assert r["slots"] == metric(text, "llamafleet_replica_slots", replica=r["id"]) or r["status"] != "ready"
    (gpu,) = status["devices"]
    assert {p["model"] for p in gpu["planned"]} == {m for m in ids.values()} == {p["model"] for p in status["plans"]}
    # one load at a time: every replica that started loading was ready before the next one started
    events = re.findall(r"\((\S+) on GPU 0\): (loading|ready in)", server.log())
    assert events and all(a[1] == "loading" and b == (a[0], "ready in") for a, b in zip(events[::2], events[1::2],
                                                                                          strict=True))


def test_a_stream_of_a_model_being_evicted_finishes(server: FleetServer) -> None:
    assert admin(server, "q8", "unload").status_code == 200
    assert admin(server, "f16", "unload").status_code == 200
    before = metric(httpx.get(f"{server.url}/metrics", timeout=10).text, "llamafleet_model_evictions_total",
                    model="q4", reason="lru")
    long = {"model": "q4", "max_tokens": 200, "stream": True, "messages": CHAT["messages"],
            "stream_options": {"include_usage": True}}
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=long, timeout=120) as r:
        assert r.status_code == 200
        others = []
        for line in r.iter_lines():
            if not others:  # the stream runs: now make q4 the least recently used and push it out
                others = [threading.Thread(target=chat, args=(server, m)) for m in ("q8", "f16")]
                for t in others:
                    t.start()
            if line.startswith("data: {") and '"usage":{' in line:
                usage = httpx.Response(200, content=line[6:]).json()["usage"]
        for t in others:
            t.join(120)
    assert usage["completion_tokens"] >= 1 and r.status_code == 200  # whole, with its usage chunk
    # q8 and f16 do not both fit beside demo and q4: q4, the only model that could go, went (after its stream)
    after = metric(httpx.get(f"{server.url}/metrics", timeout=10).text, "llamafleet_model_evictions_total",
                   model="q4", reason="lru")
    assert after == before + 1 and models(server)["q4"]["state"] == "unloaded"


def test_an_idle_model_unloads_after_its_ttl(server: FleetServer) -> None:
    assert chat(server, "short-lived").status_code == 200
    assert models(server)["short-lived"]["state"] == "loaded"
    deadline = time.monotonic() + 10
    while models(server)["short-lived"]["state"] != "unloaded" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert models(server)["short-lived"]["state"] == "unloaded"
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert metric(text, "llamafleet_model_evictions_total", model="short-lived", reason="idle") == 1


def test_the_token_routes_and_props_pick_the_named_model(server: FleetServer) -> None:
    """llama-server's routes take a ``model``: the tiny LLaMA-2-tokenizer model adds its BOS (id 1), the demo model
    (the first configured, also the default) has none to add; ``/props`` describes the one named."""
    def tokens(**model: str) -> list[int]:
        r = httpx.post(f"{server.url}/tokenize", json={"content": "Hello", "add_special": True, **model}, timeout=120)
        assert r.status_code == 200, r.text
        return list(r.json()["tokens"])

    assert tokens(model="small")[0] == 1 and tokens(model="demo") == tokens() != tokens(model="q4")
    props = httpx.get(f"{server.url}/props", params={"model": "q4"}, timeout=120).json()
    assert props["model_alias"] == "q4" and props["model_path"].endswith("tiny-q4_0.gguf")
    assert props["bos_token"] == "<s>" and props["total_slots"] == 2
    assert httpx.get(f"{server.url}/props", timeout=30).json()["model_alias"] == "demo"


def test_admin_routes_need_an_admin_key(server: FleetServer) -> None:
    assert admin(server, "q8", "load", key=None).status_code == 401
    assert admin(server, "q8", "load", key="wrong").status_code == 401
    loaded = admin(server, "q8", "load")
    assert loaded.status_code == 200 and loaded.json()["state"] == "loaded"
    pinned = admin(server, "demo", "unload")
    assert pinned.status_code == 409 and "pinned" in pinned.json()["error"]["message"]
    unloaded = admin(server, "q8", "unload")
    assert unloaded.status_code == 200 and unloaded.json()["state"] == "unloaded" and unloaded.json()["where"] == []
    assert admin(server, "nope", "load").status_code == 404


def test_models_dir_a_failed_load_and_the_bounded_wait(launch_fleet: Callable[[list[str]], FleetServer],
                                                       tiny: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    for q, path in tiny.items():
        shutil.copy(path, folder / f"{q}.gguf")
    (folder / "broken.gguf").write_bytes(unknown_tokenizer(tiny["q4_0"].read_bytes()))
    config, inventory = write_config(tmp_path, "max_loading_queue: 1\n")
    fleet = launch_fleet(["--config", str(config), "--inventory", str(inventory), "--models-dir", str(folder)])
    fleet.wait_ready()  # nothing pinned: ready at once, every model loads on demand
    assert {m: v["state"] for m, v in models(fleet).items()} == {
        "broken": "unloaded", "f16": "unloaded", "q4_0": "unloaded", "q8_0": "unloaded"}
    failed: list[httpx.Response] = []
    waiting = threading.Thread(target=lambda: failed.append(chat(fleet, "broken")))
    waiting.start()
    deadline = time.monotonic() + 30
    while models(fleet)["broken"]["waiting"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    refused = chat(fleet, "q4_0")  # one request already waits for a load: the queue is full
    waiting.join(60)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
    assert "max_loading_queue" in refused.json()["error"]["message"]
    (broken,) = failed
    assert broken.status_code == 503 and broken.headers["Retry-After"] == "5"
    assert "model 'broken' failed to load" in broken.json()["error"]["message"]
    listed = models(fleet)["broken"]
    assert listed["state"] == "failed" and listed["last_error"]
    ok = chat(fleet, "q4_0")  # the others are untouched
    assert ok.status_code == 200 and ok.json()["model"] == "q4_0"
    assert admin(fleet, "q4_0", "load").status_code == 403  # no admin key configured: admin routes are off
    assert "admin_api_keys_file" in admin(fleet, "q4_0", "load").text
