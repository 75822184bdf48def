"""Fuzz: at least 500 malformed or hostile requests against a real server with API keys on. Every answer is a 4xx
with an OpenAI error body, nothing is a 5xx (in the answers or in ``/metrics``), and a normal request still works.

The requests are random but reproducible (fixed seed): random JSON shapes, wrong types, huge and negative numbers,
invalid UTF-8, truncated and deeply nested JSON, oversize bodies, unknown routes and methods, missing, malformed
and wrong keys. Each is built to be wrong, so a 2xx is a failure too.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from scrape import metric

from conftest import FleetServer

KEY_FILE_KEY = "sk-file-key"
ENV_KEY = "sk-env-key"
MAX_BODY = 64 * 1024
N_RANDOM = 420


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["int", "float", "str", "bool", "null"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.choice([0, -1, 1, 2**31, 2**63, 10**30, -(10**30), rng.randint(-1000, 1000)])
    if kind == "float":
        return rng.choice([0.0, -0.5, 1e308, -1e308, 3.5, 1e-300])
    if kind == "str":
        return rng.choice(["", "x", "\u0000", "\ud7ff" * 3, "' OR 1=1 --", "../../etc/passwd", "a" * 1000])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["model", "prompt", "messages", "max_tokens", "n", "zzz", "stream"]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


# values that are wrong for each parameter whatever else the request holds
BAD_VALUES: dict[str, list[Any]] = {
    "max_tokens": [0, -1, 10**30, "5", 1.5, True, [], {}],
    "temperature": [-0.1, 2.5, 1e308, "hot", [1]],  # null is "not set" (OpenAI's meaning): served
    "top_p": [0, -1, 1.5, "all"],
    "n": [0, 17, 10**12, "2", 2.0],
    "stream": ["yes", 1],
    "stop": [[""], ["a"] * 17, 5, [1, 2]],
    "seed": [-1, 2**32, 2**64, "7", 0.5],
    "top_k": [-1, 2**40, "40"],
    "min_p": [-0.1, 1.1],
    "repeat_penalty": [0, -1, 11],
    "presence_penalty": [3, -3],
    "frequency_penalty": [3, -3],
    "stream_options": [{"include_usage": "yes"}, {"x": 1}, []],
    "logit_bias": [{"the": 2}, {"1": 101}, {"-1": 5}, {"1": "x"}],
    "model": [None, 5, ["x"], "gpt-4o", "../../../etc/passwd", "/models/other.gguf"],
}
CHAT_BAD = {
    "messages": [[], None, "hi", [{"role": "wizard", "content": "x"}], [{"role": "user"}],
                 [{"role": "user", "content": 5}], [{"role": "user", "content": [{"type": "image", "text": "x"}]}],
                 [{"content": "x"}]],
    "logprobs": ["true", 1],
    "top_logprobs": [3],
    "max_completion_tokens": [0, -5, 10**30],
}
TEXT_BAD = {"prompt": [None, 5, [], ["x"] * 65, [-1, 2], [[1], []], {"text": "x"}, ""], "logprobs": [21, "1"],
            "echo": ["yes"], "max_tokens": [0]}
GEN_BAD = {"prompt": [None, 5, ["x"]], "max_tokens": [0, 10**30, "9"], "stop": [[""], "x"], "extra": [1]}


def hostile_requests(model: str, good: dict[str, str]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(method, path, httpx keyword arguments) for every hostile request."""
    rng = random.Random(1234)
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    text = {"model": model, "prompt": "hi", "max_tokens": 2}
    gen = {"prompt": "hi", "max_tokens": 2}
    wrong_auth = [{}, {"authorization": "Bearer nope"}, {"authorization": f"Basic {KEY_FILE_KEY}"},
                  {"authorization": "Bearer"}, {"authorization": KEY_FILE_KEY}, {"authorization": "Bearer \tx"},
                  {"authorization": f"Bearer {KEY_FILE_KEY}x"}, {"x-api-key": f"{KEY_FILE_KEY}x"},
                  {"x-api-key": ""}]
    for headers in wrong_auth:  # valid requests, wrong or missing keys
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", text), ("/api/generate", gen)):
            yield "POST", path, {"json": body, "headers": headers}
        yield "GET", "/v1/models", {"headers": headers}
        yield "GET", "/metrics", {"headers": headers}
    for path, base, extra in (("/v1/chat/completions", chat, CHAT_BAD), ("/v1/completions", text, TEXT_BAD),
                              ("/api/generate", gen, GEN_BAD)):
        table = extra if path == "/api/generate" else {**BAD_VALUES, **extra}
        for field, values in table.items():
            for v in values:
                yield "POST", path, {"json": {**base, field: v}, "headers": good}
    paths = ["/v1/chat/completions", "/v1/completions", "/api/generate", "/v1/messages", "/v1/messages/count_tokens",
             "/v1/responses", "/tokenize", "/detokenize", "/apply-template", "/infill"]
    for rid in ("resp_unknown", "x" * 3000, "%00", "resp_unknown/input_items?limit=0", "resp_x/input_items?order=up"):
        for method in ("GET", "DELETE"):  # stored responses that are not there, or asked for wrongly
            yield method, f"/v1/responses/{rid}", {"headers": good}
    yield "POST", "/v1/responses", {"json": {"model": model, "input": "hi", "previous_response_id": "resp_x"},
                                    "headers": good}
    for _ in range(N_RANDOM):
        path = rng.choice(paths)
        roll = rng.random()
        if roll < 0.35:  # a random JSON document (never a valid request: unknown keys, wrong shapes)
            doc = _random_json(rng)
            if isinstance(doc, dict):
                doc["zzz_unknown"] = 1
            yield "POST", path, {"json": doc, "headers": good}
        elif roll < 0.5:  # a valid body cut short
            raw = json.dumps(chat if "chat" in path else text).encode()
            yield "POST", path, {"content": raw[: rng.randint(0, len(raw) - 1)], "headers": {
                **good, "content-type": "application/json"}}
        elif roll < 0.6:  # invalid UTF-8 inside an otherwise valid body
            raw = json.dumps(text).encode().replace(b'"hi"', b'"h\xff\xfe' + rng.randbytes(4) + b'"')
            yield "POST", "/v1/completions", {"content": raw, "headers": {**good, "content-type": "application/json"}}
        elif roll < 0.65:  # random bytes
            yield "POST", path, {"content": rng.randbytes(rng.randint(1, 200)),
                                 "headers": {**good, "content-type": "application/json"}}
        elif roll < 0.7:  # JSON nested deeper than any parser should follow
            depth = rng.choice([1000, 100_000])
            yield "POST", path, {"content": b"[" * depth + b"]" * depth,
                                 "headers": {**good, "content-type": "application/json"}}
        elif roll < 0.75:  # larger than the body limit
            yield "POST", path, {"content": b'{"prompt": "' + b"a" * (MAX_BODY * 2) + b'"}',
                                 "headers": {**good, "content-type": "application/json"}}
        elif roll < 0.85:  # unknown routes and wrong methods
            bad_path = rng.choice(["/v1/engines", "/v2/chat", "/admin", "/v1/models/../../etc", "/%00",
                                   "/v1/chat/completions/x", "/" + "a" * 2000])
            method = rng.choice(["GET", "POST", "DELETE", "PUT"])
            yield method, bad_path, {"headers": good}
            yield rng.choice(["GET", "DELETE", "PATCH"]), path, {"headers": good}
        else:  # not JSON at all, or not an object
            yield "POST", path, {"content": rng.choice([b"", b"null", b"[]", b'"x"', b"{,}", b"NaN"]),
                                 "headers": {**good, "content-type": rng.choice(["application/json", "text/plain"])}}


def _server_errors(metrics_text: str) -> list[str]:
    """The 5xx samples of the HTTP request counter."""
    return [line for line in metrics_text.splitlines()
            if line.startswith("llamafleet_http_requests_total") and 'status="5' in line]


@pytest.fixture(scope="module")
def locked(launch_fleet: Callable[[list[str]], FleetServer], model_path: Path, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[FleetServer]:
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"# the fuzz test's key\n{KEY_FILE_KEY}\n", encoding="utf-8")
    config = keys.with_name("fleet.yaml")
    config.write_text(f"max_body_bytes: {MAX_BODY}\n", encoding="utf-8")
    mp = pytest.MonkeyPatch()
    mp.setenv("LLAMAFLEET_API_KEYS", f" {ENV_KEY} ,")  # read by the server at start-up
    try:
        server = launch_fleet(["--config", str(config), "--model", str(model_path), "--replicas", "1",
                               "--parallel", "2", "--ctx", "256", "--threads", "1", "--api-keys-file", str(keys)])
    finally:
        mp.undo()
    server.wait_ready()
    yield server


def test_hostile_requests_get_4xx_json_errors_and_the_server_keeps_serving(locked: FleetServer) -> None:
    good = {"authorization": f"Bearer {KEY_FILE_KEY}"}
    model = locked.model()
    statuses: Counter[int] = Counter()
    sent = 0
    with httpx.Client(base_url=locked.url, timeout=60) as client:
        errors_before = _server_errors(client.get("/metrics", headers=good).text)  # /ready said 503 while loading
        for method, path, kw in hostile_requests(model, good):
            r = client.request(method, path, **kw)
            sent += 1
            assert 400 <= r.status_code < 500, (method, path, str(kw)[:300], r.status_code, r.text[:300])
            error = r.json()["error"]
            assert isinstance(error["message"], str) and error["message"] and error["type"], r.text
            if r.status_code == 401:
                assert r.headers["www-authenticate"] == "Bearer"
            statuses[r.status_code] += 1
        print(f"\nfuzz: {sent} hostile requests, answers {dict(sorted(statuses.items()))}")
        assert sent >= 500 and {400, 401, 404, 413} <= set(statuses)

        assert client.get("/health").status_code == 200  # probes need no key
        assert client.get("/ready").status_code == 200
        for key in (KEY_FILE_KEY, ENV_KEY):
            r = client.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        text = client.get("/metrics", headers=good).text
    assert _server_errors(text) == errors_before
    assert metric(text, "llamafleet_http_requests_total", route="other", method="POST", status="401") > 0


def test_a_stored_response_is_the_creating_keys_alone(locked: FleetServer) -> None:
    """With API keys on, a response stored under one key is a 404 for every other valid key, as an unknown id is."""
    with httpx.Client(base_url=locked.url, timeout=60) as client:
        mine, theirs = ({"authorization": f"Bearer {KEY_FILE_KEY}"}, {"x-api-key": ENV_KEY})
        r = client.post("/v1/responses", headers=mine, json={"model": locked.model(), "input": "hi",
                                                             "max_output_tokens": 2})
        assert r.status_code == 200 and r.json()["store"] is True, r.text
        rid = r.json()["id"]
        for method, path in (("GET", rid), ("GET", f"{rid}/input_items"), ("DELETE", rid)):
            r = client.request(method, f"/v1/responses/{path}", headers=theirs)
            assert r.status_code == 404 and r.json()["error"]["message"] == f"Response with id '{rid}' not found."
        r = client.post("/v1/responses", headers=theirs, json={"model": locked.model(), "input": "hi",
                                                               "previous_response_id": rid, "max_output_tokens": 2})
        assert r.status_code == 404 and r.json()["error"]["code"] == "previous_response_not_found"
        assert client.get(f"/v1/responses/{rid}", headers=mine).json()["id"] == rid
