"""LoRA adapters served end to end, through the OpenAI SDK: a synthetic tiny model with adapters ``synth`` writes for
it under ``lora:``; ``MODEL:ADAPTER`` names in ``/v1/models`` and in requests; llama-server's per-request ``lora``
list; two requests with different adapters decoding in the same steps, each with its own answer; a scale of 0 is the
base model; the admin routes (llama-server's list, ours and vLLM's load and unload); the refusals naming what is
wrong."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from conftest import FleetServer
from llamafleet.model.synth import SHAPES, find_vocab, write_model
from llamafleet.model.synth_lora import write_lora

ADMIN = "lora-admin-key"
PROMPT = "The quick brown fox jumps over the lazy dog and"
N = 48  # tokens per answer
LONG = 160  # tokens of an answer that another runs beside


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("lora-server")
    base = write_model(folder / "tiny.gguf", SHAPES["tiny"], "q8_0", find_vocab(), progress=False)
    return {"base": base, **{k: write_lora(base, folder / f"{k}.gguf", seed=i + 1) for i, k in enumerate("abc")}}


@pytest.fixture(scope="module")
def server(launch_fleet: Callable[[list[str]], FleetServer], files: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> FleetServer:
    folder = tmp_path_factory.mktemp("lora-config")
    (folder / "admin.keys").write_text(ADMIN + "\n", encoding="utf-8")
    config = folder / "fleet.yaml"
    config.write_text(f"model_path: {files['base']}\nmodel_name: tiny\nparallel: 4\ncontext_length: 256\n"
                      f"threads: 1\nadmin_api_keys_file: {folder / 'admin.keys'}\nlora:\n  - {files['a']}\n"
                      f"  - {{path: {files['b']}, name: bee, scale: 0.5}}\n", encoding="utf-8")
    fleet = launch_fleet(["--config", str(config)])
    fleet.wait_ready()
    return fleet


@pytest.fixture(scope="module")
def client(server: FleetServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=ADMIN, max_retries=0, timeout=120.0)


def answer(client: openai.OpenAI, model: str = "tiny", **extra: Any) -> str:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=N, temperature=0,
                                  extra_body={"ignore_eos": True, **extra})
    return r.choices[0].text


def steps(server: FleetServer) -> float:
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    return sum(float(v) for v in re.findall(r"^llamafleet_engine_steps_total\{[^}]*\} (\S+)$", text, re.M))


def admin(server: FleetServer, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.request(method, f"{server.url}{path}", json=body, headers={"Authorization": f"Bearer {ADMIN}"},
                         timeout=60)


def test_models_lists_each_adapter_as_a_model(client: openai.OpenAI) -> None:
    cards = {m.id: m for m in client.models.list().data}
    assert {"tiny", "tiny:a", "tiny:bee"} <= set(cards)
    assert (cards["tiny:a"].model_extra or {})["parent"] == "tiny"
    assert client.models.retrieve("tiny:bee").id == "tiny:bee"


def test_adapters_by_name_and_by_lora_list(client: openai.OpenAI) -> None:
    base, a, bee = answer(client), answer(client, "tiny:a"), answer(client, "tiny:bee")
    assert len({base, a, bee}) == 3
    assert answer(client, lora=[{"id": 0, "scale": 0}]) == base  # scale 0: the base model
    assert answer(client, "tiny:a", lora=[{"id": "a", "scale": 0.0}]) == base
    assert answer(client, lora=[{"id": 0, "scale": 1.0}]) == a
    assert answer(client, lora=[{"id": "bee"}]) == bee  # the configured scale, 0.5
    assert answer(client, lora=[{"id": 1, "scale": 0.5}]) == bee
    chat = client.chat.completions.create(model="tiny:a", messages=[{"role": "user", "content": PROMPT}],
                                          max_tokens=8, temperature=0)
    assert chat.model == "tiny:a"


def test_two_adapters_in_the_same_steps_each_with_its_own_answer(server: FleetServer,
                                                                  client: openai.OpenAI) -> None:
    long: dict[str, Any] = {"model": "tiny:a", "prompt": PROMPT, "max_tokens": LONG, "temperature": 0,
                            "extra_body": {"ignore_eos": True}}
    alone = ("".join(c.choices[0].text for c in client.completions.create(**long, stream=True)),
             answer(client, "tiny:bee"))
    before = steps(server)
    stream = client.completions.create(**long, stream=True)
    first = next(iter(stream)).choices[0].text  # the long answer runs; the short one starts beside it
    short = answer(client, "tiny:bee")
    rest = "".join(c.choices[0].text for c in stream)
    assert (first + rest, short) == alone
    assert steps(server) - before < LONG + N // 2  # one after the other would take LONG + N steps


def test_unknown_adapters_and_bad_scales_are_refused_by_name(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="no LoRA adapter 'nope'"):
        answer(client, "tiny:nope")
    with pytest.raises(openai.BadRequestError, match=r"lora\[0\]\.id: no adapter 7"):
        answer(client, lora=[{"id": 7, "scale": 1.0}])
    with pytest.raises(openai.BadRequestError, match="no adapter 'zz'"):
        answer(client, lora=[{"id": "zz"}])
    with pytest.raises(openai.BadRequestError, match="scale"):
        answer(client, lora=[{"id": 0, "scale": "high"}])
    with pytest.raises(openai.BadRequestError, match="not to embeddings"):
        client.embeddings.create(model="tiny:a", input="hello")


def test_load_list_and_unload_at_runtime(server: FleetServer, client: openai.OpenAI, files: dict[str, Path]) -> None:
    listed = httpx.get(f"{server.url}/lora-adapters", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert [(x["id"], x["name"], x["scale"]) for x in listed] == [(0, "a", 1.0), (1, "bee", 0.5)]
    r = admin(server, "POST", "/admin/models/tiny/adapters", {"path": str(files["c"]), "name": "c"})
    assert r.status_code == 200, r.text
    assert [x["model"] for x in r.json()] == ["tiny:a", "tiny:bee", "tiny:c"]
    c = answer(client, "tiny:c")
    assert c not in (answer(client), answer(client, "tiny:a"))
    assert admin(server, "POST", "/admin/models/tiny/adapters", {"path": str(files["c"]), "name": "c"}).status_code \
        == 409
    r = admin(server, "POST", "/admin/models/tiny/adapters", {"path": str(files["base"])})
    assert r.status_code == 422 and "not a LoRA adapter" in r.text
    assert admin(server, "DELETE", "/admin/models/tiny/adapters/c").status_code == 200
    with pytest.raises(openai.NotFoundError, match="no LoRA adapter 'c'"):
        answer(client, "tiny:c")
    r = admin(server, "POST", "/v1/load_lora_adapter", {"lora_name": "cc", "lora_path": str(files["c"])})
    assert r.status_code == 200, r.text
    assert answer(client, "tiny:cc") == c
    assert admin(server, "POST", "/v1/unload_lora_adapter", {"lora_name": "cc"}).status_code == 200
    assert admin(server, "DELETE", "/admin/models/tiny/adapters/cc").status_code == 404
    unauthorized = httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "y"})
    assert unauthorized.status_code in (401, 403)
