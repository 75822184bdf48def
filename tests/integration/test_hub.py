"""Models by name from the Hugging Face hub, against a local hub (tests/hub_server.py) that ``HF_ENDPOINT`` points
at: references and their errors, plan before download, integrity and faults (a dropped connection, a wrong checksum,
a gated repo, a disk too small, no hub), the store (pull, models, rm), concurrent pulls. Every command runs as a user
runs it, in its own process with its own hub cache (``HF_HOME``)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from conftest import FleetServer
from hub_server import LocalHub
from llamafleet.exits import Exit
from llamafleet.model.synth import SHAPES, find_vocab, write_model
from synth_models import split_model

INVENTORIES = Path(__file__).parents[2] / "examples" / "inventories"
CHUNK = 10 << 20  # huggingface_hub writes a download in chunks of this size


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("hub-files")
    vocab = find_vocab()
    out = {q: write_model(folder / f"micro-{q.upper()}.gguf", SHAPES["micro"], q, vocab, progress=False)
           for q in ("q4_0", "q8_0")}
    out["70b"] = write_model(folder / "llama2-70b-Q4_0.gguf", SHAPES["llama2-70b"], "q4_0", vocab, sparse=True,
                             progress=False)
    blob = folder / "blob-Q8_0.gguf"  # not a model: for transfers only (two and a half chunks of random bytes)
    blob.write_bytes(os.urandom(2 * CHUNK + (4 << 20)))
    out["blob"] = blob
    (folder / "README.md").write_text("# a repo\n")
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    out["readme"], out["safetensors"] = folder / "README.md", folder / "model.safetensors"
    return out


@pytest.fixture(scope="module")
def hub(files: dict[str, Path]) -> Iterator[LocalHub]:
    with LocalHub() as h:
        h.add("org/micro-GGUF", {"micro-Q4_0.gguf": files["q4_0"], "micro-Q8_0.gguf": files["q8_0"],
                                 "README.md": files["readme"]})
        h.add("org/twins-GGUF", {"a-Q4_0.gguf": files["q4_0"], "b-Q4_0.gguf": files["q4_0"]})
        h.add("org/weights-only", {"model.safetensors": files["safetensors"], "README.md": files["readme"]})
        h.add("org/gated-GGUF", {"micro-Q4_0.gguf": files["q4_0"]}, gated=True)
        h.add("org/llama2-70b-GGUF", {"llama2-70b-Q4_0.gguf": files["70b"]})
        h.add("org/blob-GGUF", {"blob-Q8_0.gguf": files["blob"]})
        yield h


def llamafleet(hub: LocalHub | str, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``llamafleet ARGS`` against the hub (or a URL), with the hub cache under ``home``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    base |= {"HF_ENDPOINT": hub if isinstance(hub, str) else hub.url, "HF_HOME": str(home),
             "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_ETAG_TIMEOUT": "5"}
    return subprocess.run([sys.executable, "-m", "llamafleet.cli", *args], env=base | env, capture_output=True,
                          text=True, timeout=300)


def blobs(home: Path) -> list[Path]:
    return [p for p in (home / "hub").rglob("blobs/*") if p.is_file()]


def test_plan_reads_the_header_of_a_70b_model_not_its_weights(hub: LocalHub, files: dict[str, Path],
                                                              tmp_path: Path) -> None:
    hub.reset_counts()
    r = llamafleet(hub, tmp_path, "plan", "--model", "hf:org/llama2-70b-GGUF:Q4_0", "--inventory",
                   str(INVENTORIES / "4x80gb-nvlink.yaml"), "--json")
    assert r.returncode == Exit.OK, r.stderr
    plan = json.loads(r.stdout)
    assert plan["fits"]
    assert plan["model_path"].endswith("snapshots/" + hub.repos["org/llama2-70b-GGUF"].refs["main"]
                                       + "/llama2-70b-Q4_0.gguf")
    assert files["70b"].stat().st_size > 30e9
    assert 0 < hub.bytes_out < 16e6, hub.bytes_out
    assert blobs(tmp_path) == []


def test_serve_refuses_a_model_that_cannot_fit_before_downloading_it(hub: LocalHub, tmp_path: Path) -> None:
    hub.reset_counts()
    r = llamafleet(hub, tmp_path, "serve", "--model", "hf:org/llama2-70b-GGUF:Q4_0", "--inventory",
                   str(INVENTORIES / "1x24gb.yaml"), "--port", "1")
    assert r.returncode == Exit.NO, r.stderr
    assert "hf:org/llama2-70b-GGUF:Q4_0 does not fit this machine" in r.stderr
    assert "nothing was downloaded" in r.stderr
    assert "plan:" in r.stderr  # the planner's reasons
    assert hub.bytes_out < 16e6 and blobs(tmp_path) == []


@pytest.mark.parametrize(("ref", "rc", "said"), [
    ("hf:org/twins-GGUF:Q4_0", Exit.MODEL, ["2 files carry the quant tag Q4_0", "a-Q4_0.gguf", "b-Q4_0.gguf"]),
    ("hf:org/micro-GGUF:IQ1_S", Exit.MODEL, ["no file carries the quant tag IQ1_S", "micro-Q4_0.gguf",
                                             "micro-Q8_0.gguf"]),
    ("hf:org/weights-only", Exit.MODEL, ["holds no .gguf file", "README.md, model.safetensors"]),
    ("hf:org/nobody-GGUF:Q4_0", Exit.MODEL, ["no repo org/nobody-GGUF at http://127.0.0.1:"]),
    ("hf:org/micro-GGUF:Q4_0@v9", Exit.MODEL, ["has no revision 'v9'"]),
    ("hf:org/micro-GGUF/../../etc/x.gguf", Exit.USAGE, ["not a plain path", "hf:ORG/REPO:QUANT", "@REVISION"]),
    ("hf:org", Exit.USAGE, ["names no repo", "hf:ORG/REPO/FILE.gguf"]),
])
def test_references_that_name_no_model_say_what_there_is(hub: LocalHub, tmp_path: Path, ref: str, rc: int,
                                                         said: list[str]) -> None:
    r = llamafleet(hub, tmp_path, "pull", ref)
    assert r.returncode == rc, r.stderr
    for words in said:
        assert words in r.stderr
    assert "Traceback" not in r.stderr


def test_pull_models_and_rm(hub: LocalHub, files: dict[str, Path], tmp_path: Path) -> None:
    r = llamafleet(hub, tmp_path, "pull", "hf:org/micro-GGUF:q8_0")
    assert r.returncode == Exit.OK, r.stderr
    path = Path(r.stdout.strip())
    assert path.name == "micro-Q8_0.gguf" and sha256(path) == sha256(files["q8_0"])
    config = tmp_path / "fleet.yaml"
    config.write_text("models:\n  - {name: tiny, path: 'hf:org/micro-GGUF:Q8_0'}\n  - {name: other, path: x.gguf}\n")
    listed = json.loads(llamafleet(hub, tmp_path, "models", "--json", "--config", str(config)).stdout)
    assert [(m["ref"], m["quant"], m["size"], m["path"], m["used_by"]) for m in listed] == [
        ("hf:org/micro-GGUF/micro-Q8_0.gguf", "Q8_0", files["q8_0"].stat().st_size, str(path), ["tiny"])]
    table = llamafleet(hub, tmp_path, "models").stdout
    assert "hf:org/micro-GGUF/micro-Q8_0.gguf" in table and "Q8_0" in table and str(path) in table
    hub.reset_counts()
    again = llamafleet(hub, tmp_path, "pull", "hf:org/micro-GGUF/micro-Q8_0.gguf")
    assert again.stdout.strip() == str(path) and "already in the cache" in again.stderr
    assert hub.served["micro-Q8_0.gguf"] == 0
    r = llamafleet(hub, tmp_path, "rm", "hf:org/micro-GGUF:Q8_0")
    assert r.returncode == Exit.OK and "removed hf:org/micro-GGUF/micro-Q8_0.gguf" in r.stdout
    assert not path.exists() and blobs(tmp_path) == []
    assert "no GGUF model in the hub cache" in llamafleet(hub, tmp_path, "models").stdout
    r = llamafleet(hub, tmp_path, "rm", "hf:org/micro-GGUF:Q8_0")
    assert r.returncode == Exit.MODEL and "holds no such model" in r.stderr


def test_a_dropped_connection_resumes_without_fetching_again_what_it_has(hub: LocalHub, files: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    hub.reset_counts()
    size = files["blob"].stat().st_size
    hub.drop_after["blob-Q8_0.gguf"] = 2 * CHUNK  # cut after two whole chunks were written
    r = llamafleet(hub, tmp_path, "pull", "hf:org/blob-GGUF:Q8_0")
    assert r.returncode == Exit.OK, r.stderr
    assert "Trying to resume download" in r.stderr
    assert sha256(Path(r.stdout.strip())) == sha256(files["blob"])
    assert hub.served["blob-Q8_0.gguf"] == size  # the retry asked for the rest only
    assert hub.ranges == [f"bytes={2 * CHUNK}-"]


def test_a_wrong_checksum_is_refused_and_deleted(hub: LocalHub, files: dict[str, Path], tmp_path: Path) -> None:
    hub.corrupt.add("micro-Q4_0.gguf")
    try:
        r = llamafleet(hub, tmp_path, "pull", "hf:org/micro-GGUF:Q4_0")
    finally:
        hub.corrupt.clear()
    assert r.returncode == Exit.MODEL
    assert "micro-Q4_0.gguf does not match the hub's sha256" in r.stderr and "the download was deleted" in r.stderr
    assert blobs(tmp_path) == []
    r = llamafleet(hub, tmp_path, "pull", "hf:org/micro-GGUF:Q4_0")
    assert r.returncode == Exit.OK and sha256(Path(r.stdout.strip())) == sha256(files["q4_0"])


def test_a_gated_repo_needs_a_token(hub: LocalHub, tmp_path: Path) -> None:
    r = llamafleet(hub, tmp_path, "pull", "hf:org/gated-GGUF:Q4_0")
    assert r.returncode == Exit.MODEL
    assert "hf:org/gated-GGUF:Q4_0: org/gated-GGUF is a gated repo" in r.stderr and "HF_TOKEN" in r.stderr
    r = llamafleet(hub, tmp_path, "plan", "--model", "hf:org/gated-GGUF:Q4_0")  # its header, by a ranged read
    assert r.returncode == Exit.MODEL and "is a gated repo" in r.stderr
    r = llamafleet(hub, tmp_path, "pull", "hf:org/gated-GGUF:Q4_0", HF_TOKEN=hub.token)
    assert r.returncode == Exit.OK, r.stderr


def test_a_download_that_would_fill_the_disk_is_refused_before_it_starts(hub: LocalHub, tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    huge = tmp_path / "huge-Q4_0.gguf"
    with huge.open("wb") as f:
        f.truncate(free + (8 << 30))  # a hole: takes no room here
    hub.add("org/huge-GGUF", {"huge-Q4_0.gguf": huge})
    hub.reset_counts()
    r = llamafleet(hub, tmp_path / "home", "pull", "hf:org/huge-GGUF:Q4_0")
    assert r.returncode == Exit.MODEL
    assert "the download needs" in r.stderr and "GiB free; free" in r.stderr and "HF_HUB_CACHE" in r.stderr
    assert hub.served["huge-Q4_0.gguf"] == 0


def test_without_the_hub_a_cached_copy_is_used_and_a_missing_one_named(hub: LocalHub, tmp_path: Path) -> None:
    assert llamafleet(hub, tmp_path, "pull", "hf:org/micro-GGUF:Q4_0").returncode == Exit.OK
    gone = "http://127.0.0.1:9"  # nothing listens there
    for endpoint, env in ((hub.url, {"HF_HUB_OFFLINE": "1"}), (gone, {})):
        r = llamafleet(endpoint, tmp_path, "plan", "--model", "hf:org/micro-GGUF:Q4_0", "--json", **env)
        assert r.returncode in (Exit.OK, Exit.NO), r.stderr
        assert "using the cached copy" in r.stderr
        assert json.loads(r.stdout)["model_path"].endswith("/micro-Q4_0.gguf")
    r = llamafleet(gone, tmp_path, "plan", "--model", "hf:org/micro-GGUF:Q8_0")
    assert r.returncode == Exit.MODEL
    assert "hf:org/micro-GGUF:Q8_0: the hub at http://127.0.0.1:9 cannot be reached" in r.stderr
    assert "holds no copy of it" in r.stderr
    r = llamafleet(hub, tmp_path, "pull", "hf:org/micro-GGUF:Q8_0", HF_HUB_OFFLINE="1")
    assert r.returncode == Exit.MODEL and "HF_HUB_OFFLINE is set" in r.stderr
    r = llamafleet(gone, tmp_path, "pull", "hf:org/micro-GGUF:Q4_0")
    assert r.returncode == Exit.OK and r.stdout.strip().endswith("/micro-Q4_0.gguf"), r.stderr


def test_two_pulls_of_one_file_at_once_fetch_it_once_and_whole(hub: LocalHub, files: dict[str, Path],
                                                               tmp_path: Path) -> None:
    hub.reset_counts()
    hub.rate = 4e6  # about 6 s for the file: the second pull comes while the first one holds the lock
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path), "HF_HUB_DISABLE_TELEMETRY": "1"}
    try:
        procs = [subprocess.Popen([sys.executable, "-m", "llamafleet.cli", "pull", "hf:org/blob-GGUF:Q8_0"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        hub.rate = None
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("fetching" in err for _, err in outs)  # both found it missing: they ran at once
    paths = {Path(out.strip()) for out, _ in outs}
    assert len(paths) == 1 and sha256(paths.pop()) == sha256(files["blob"])
    assert hub.served["blob-Q8_0.gguf"] == files["blob"].stat().st_size
    assert len(blobs(tmp_path)) == 1


@pytest.fixture(scope="module")
def served_hub(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHub]:
    """A hub with the demo model and a tiny synthetic model split in two, for servers to load."""
    folder = tmp_path_factory.mktemp("split")
    tiny = write_model(folder / "whole" / "tiny-Q4_0.gguf", SHAPES["tiny"], "q4_0", find_vocab(), progress=False)
    parts = split_model(tiny, folder, 2)
    with LocalHub() as h:
        h.add("org/SmolLM2-GGUF", {"SmolLM2-135M-Instruct-Q4_1.gguf": model_path})
        h.add("org/tiny-GGUF", {p.name: p for p in parts})
        yield h


def serve(launch_fleet: Callable[[list[str]], FleetServer], hub: LocalHub, home: Path, args: list[str]) -> FleetServer:
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the server process inherits them
    try:
        return launch_fleet(args)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def test_serve_fetches_a_split_model_after_its_plan_and_serves_it(
        served_hub: LocalHub, launch_fleet: Callable[[list[str]], FleetServer], tmp_path: Path) -> None:
    server = serve(launch_fleet, served_hub, tmp_path, ["--model", "hf:org/tiny-GGUF:Q4_0", "--ctx", "256",
                                                        "--parallel", "1", "--threads", "1"])
    server.wait_ready()
    log = server.log()
    assert log.index("plan:") < log.index("downloading hf:org/tiny-GGUF:Q4_0")
    assert "downloaded tiny-Q4_0-00002-of-00002.gguf" in log
    assert server.model() == "tiny-Q4_0"  # a split model is named without its part suffix
    answer = server.client().completions.create(model=server.model(), prompt="Hello", max_tokens=4)
    assert answer.usage is not None and answer.usage.completion_tokens == 4
    server.stop()


def test_a_fleet_names_the_demo_model_by_reference(
        served_hub: LocalHub, launch_fleet: Callable[[list[str]], FleetServer], tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("models:\n  - {name: smol, path: 'hf:org/SmolLM2-GGUF:Q4_1', context_length: 256, parallel: 1}\n"
                      "threads: 1\n")
    server = serve(launch_fleet, served_hub, tmp_path, ["--config", str(config)])
    server.wait_ready()
    chat = server.client().chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=4)
    assert chat.choices[0].message.content
    server.stop()


def test_an_admin_pulls_a_model_into_a_running_server(
        served_hub: LocalHub, files: dict[str, Path], launch_fleet: Callable[[list[str]], FleetServer],
        tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "micro.gguf").symlink_to(files["q4_0"])
    os.environ["LLAMAFLEET_ADMIN_API_KEYS"] = "admin-key"
    try:
        server = serve(launch_fleet, served_hub, tmp_path, ["--models-dir", str(folder), "--ctx", "256",
                                                            "--parallel", "1", "--threads", "1"])
    finally:
        del os.environ["LLAMAFLEET_ADMIN_API_KEYS"]
    server.wait_ready()
    admin = httpx.Client(base_url=server.url, headers={"Authorization": "Bearer admin-key"}, timeout=60)
    served_hub.rate = 4e6  # about 3 s for its 12 MB: time to see it downloading
    try:
        r = admin.post("/admin/models/pull", json={"model": "hf:org/tiny-GGUF:Q4_0", "name": "tiny"})
        assert r.status_code == 202, r.text
        assert r.json()["state"] == "downloading" and r.json()["download"]["total"] > 10e6
        seen, on_dashboard = [], []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            card = {m["id"]: m for m in httpx.get(f"{server.url}/v1/models").json()["data"]}["tiny"]
            seen.append(card)
            if card["state"] != "downloading":
                break
            on_dashboard += httpx.get(f"{server.url}/v1/status").json()["downloads"]
            time.sleep(0.3)
    finally:
        served_hub.rate = None
    assert card["state"] == "unloaded" and card["download"] is None, card
    assert on_dashboard and on_dashboard[-1]["id"] == "tiny" and on_dashboard[-1]["download"]["total"] > 10e6
    assert httpx.get(f"{server.url}/v1/status").json()["downloads"] == []
    moving = [c["download"] for c in seen if c["state"] == "downloading" and c["download"]["bytes"] > 0]
    assert moving and moving[-1]["bytes_per_s"] > 0 and moving[-1]["eta_s"] is not None
    assert sorted(p.name for p in folder.iterdir()) == ["micro.gguf", "tiny-Q4_0-00001-of-00002.gguf",
                                                         "tiny-Q4_0-00002-of-00002.gguf"]
    answer = server.client().completions.create(model="tiny", prompt="Hello", max_tokens=3)
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    assert "downloaded tiny-Q4_0-00002-of-00002.gguf" in server.log()
    # refused before any download: a taken name, a malformed reference, a disk too small
    r = admin.post("/admin/models/pull", json={"model": "hf:org/tiny-GGUF:Q4_0", "name": "micro"})
    assert r.status_code == 409 and "already has a model named 'micro'" in r.json()["error"]["message"]
    r = admin.post("/admin/models/pull", json={"model": "hf:org/tiny-GGUF/../x.gguf"})
    assert r.status_code == 400 and "hf:ORG/REPO:QUANT" in r.json()["error"]["message"]
    huge = tmp_path / "huge-Q4_0.gguf"
    with huge.open("wb") as f:
        f.truncate(shutil.disk_usage(tmp_path).free + (8 << 30))
    served_hub.add("org/huge-GGUF", {huge.name: huge})
    r = admin.post("/admin/models/pull", json={"model": "hf:org/huge-GGUF:Q4_0"})
    assert r.status_code == 507 and "the download needs" in r.json()["error"]["message"]
    assert httpx.post(f"{server.url}/admin/models/pull", json={"model": "hf:org/tiny-GGUF:Q4_0"}).status_code == 401
    served_hub.rate = 1e5  # the demo model's 100 MB would take 1000 s: a server stopped meanwhile does not wait for it
    try:
        assert admin.post("/admin/models/pull", json={"model": "hf:org/SmolLM2-GGUF:Q4_1"}).status_code == 202
        admin.close()
        assert server.stop(timeout=60) is not None, server.log()[-3000:]
    finally:
        served_hub.rate = None


def test_a_draft_model_named_on_the_hub_is_fetched_and_planned(hub: LocalHub, tmp_path: Path) -> None:
    config = tmp_path / "spec.yaml"
    config.write_text("model_path: 'hf:org/micro-GGUF:Q4_0'\n"
                      "speculative: {mode: draft, draft_model: 'hf:org/micro-GGUF:Q8_0'}\n")
    r = llamafleet(hub, tmp_path, "plan", "--config", str(config))
    assert r.returncode in (Exit.OK, Exit.NO), r.stderr
    assert "draft model" in r.stdout and "beside it in each replica" in r.stdout
    assert [p.name for p in (tmp_path / "hub").rglob("micro-Q8_0.gguf")] == ["micro-Q8_0.gguf"]  # the draft, fetched
    config.write_text("speculative: {mode: draft, draft_model: 'hf:org/micro-GGUF/../x.gguf'}\n")
    r = llamafleet(hub, tmp_path, "plan", "--config", str(config))
    assert r.returncode == Exit.USAGE and "draft_model" in r.stderr and "hf:ORG/REPO:QUANT" in r.stderr
