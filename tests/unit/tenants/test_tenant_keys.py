"""The keys file as tenants: both forms, errors that name the line and the field, `llamafleet keys`, reloads."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llamafleet.cli import main
from llamafleet.fleet.telemetry import FleetMetrics
from llamafleet.tenants.keys import ApiKeysError, KeyEntry, add_entry, digest, load_keyring
from llamafleet.tenants.tenancy import Tenancy

AGENTS = digest("sk-agents").hex()
TENANTS = f"""\
# the team's keys
keys:
  - {{name: agents, sha256: "{AGENTS}", scopes: [inference, embeddings], models: ["chat*"], priority: interactive,
     limits: {{requests_per_minute: 600, tokens_per_minute: 200000, tokens_per_day: 5000000, concurrent: 32}}}}
  - {{name: ci, key: sk-test-1234, scopes: [inference]}}
"""


def _file(tmp_path: Path, text: str, name: str = "keys.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_the_tenants_form_names_scopes_models_priority_and_limits(tmp_path: Path) -> None:
    ring = load_keyring(_file(tmp_path, TENANTS), environ={"LLAMAFLEET_API_KEYS": "env-key"})
    agents, ci, env = ring.identify(b"sk-agents"), ring.identify(b"sk-test-1234"), ring.identify(b"env-key")
    assert agents is not None and ci is not None and env is not None
    assert ring.identify(b"sk-agent") is None and not ring.open and not ring.has_admin
    assert agents.name == "agents" and agents.scopes == {"inference", "embeddings"} and agents.priority == 0
    assert agents.may_use("chat-large") and not agents.may_use("embedder")
    assert agents.limits.requests_per_minute == 600 and agents.limits.concurrent == 32 and agents.limits.any
    assert ci.priority == 1 and ci.may_use("anything") and not ci.limits.any and not ci.plain
    assert env.plain and env.name.startswith("key-") and "env-key" not in env.name  # named by its hash, never itself
    assert ring.usage_file == str(tmp_path / "keys.usage.sqlite")


def test_a_plain_list_and_admin_keys_keep_their_meaning(tmp_path: Path) -> None:
    ring = load_keyring(_file(tmp_path, "k1\n# comment\nk2  # ci\n", "keys"), _file(tmp_path, "root\n", "admin"),
                        environ={})
    assert {t.scopes for t in ring.tenants.values()} == {frozenset({"inference", "embeddings", "metrics"}),
                                                        frozenset({"inference", "embeddings", "metrics", "admin"})}
    assert ring.identify(b"k2") is not None and ring.has_admin and not ring.open and ring.usage_file is None
    assert load_keyring(None, _file(tmp_path, "root\n", "admin"), environ={}).open  # admin keys alone: API open


@pytest.mark.parametrize(("text", "expected"), [
    ("keys:\n  - name: a\n    key: k\n    limits: {concurrent: 0}\n",
     "line 4, 'keys[0].limits.concurrent': Input should be greater than 0"),
    ("keys:\n  - {name: a, key: k}\n  - {name: b, key: j, scopes: [inferense]}\n",
     "line 3, 'keys[1].scopes': unknown scope 'inferense': did you mean 'inference'?"),
    ("keys:\n  - {name: a, key: k, sha256: abc}\n", "line 2, 'keys[0].sha256': sha256 must be 64 hex digits"),
    ("keys:\n  - {name: a}\n", "exactly one of 'sha256'"),
    ("keys:\n  - {name: a, key: k}\n  - {name: a, key: j}\n", "same name (a)"),
    ("keys:\n  - {name: a, key: k, priorty: batch}\n", "line 2, 'keys[0].priorty': Extra inputs are not permitted"),
    ("keys: []\n", "line 1, 'keys'"),
])
def test_a_bad_keys_file_names_the_line_and_the_field(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ApiKeysError, match="is not a valid keys file") as e:
        load_keyring(_file(tmp_path, text), environ={})
    assert expected in str(e.value)


def test_keys_add_prints_the_key_once_and_writes_only_its_hash(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "keys.yaml"
    assert main(["keys", "add", "scorer", "--file", str(path), "--priority", "batch", "--scopes", "inference",
                 "--tokens-per-minute", "5000"]) == 0
    key = capsys.readouterr().out.strip()
    assert main(["keys", "add", "agents", "--file", str(path), "--models", "chat*,embed"]) == 0
    second = capsys.readouterr().out.strip()
    text = path.read_text(encoding="utf-8")
    assert key.startswith("sk-") and key not in text and digest(key).hex() in text
    ring = load_keyring(str(path), environ={})
    scorer, agents = ring.identify(key.encode()), ring.identify(second.encode())
    assert scorer is not None and scorer.priority == 2 and scorer.limits.tokens_per_minute == 5000
    assert agents is not None and agents.models == ("chat*", "embed") and agents.scopes == {"inference",
                                                                                           "embeddings", "metrics"}
    assert main(["keys", "add", "agents", "--file", str(path)]) == 2  # the name is taken
    assert main(["keys", "add", "x", "--file", str(path), "--scopes", "admn"]) == 2
    assert "did you mean 'admin'" in capsys.readouterr().err
    assert main(["keys", "list", "--file", str(path)]) == 0
    listed = capsys.readouterr().out
    assert "scorer: scopes inference" in listed and key not in listed


def test_a_reload_takes_a_good_file_and_keeps_the_old_keys_over_a_bad_one(tmp_path: Path) -> None:
    path = _file(tmp_path, TENANTS)
    tenancy = Tenancy(load_keyring(path, environ={}), FleetMetrics(), (path, None), environ={})
    Path(path).write_text("keys:\n  - {name: a, key: new, scopes: [inferenc]}\n", encoding="utf-8")
    assert not tenancy.reload() and tenancy.ring.identify(b"sk-test-1234") is not None
    Path(path).write_text("keys:\n  - {name: a, key: new}\n", encoding="utf-8")
    assert tenancy.reload() and tenancy.ring.identify(b"new") is not None
    assert tenancy.ring.identify(b"sk-test-1234") is None


def _watch_until_known(tenancy: Tenancy, key: bytes, act: Callable[[], None]) -> bool:
    """Run the watch, ``act`` once it runs, and whether ``key`` is known within 10 s."""

    async def run() -> bool:
        watching = asyncio.create_task(tenancy.watch())
        await asyncio.sleep(0.2)
        act()
        for _ in range(100):
            if tenancy.ring.identify(key) is not None:
                break
            await asyncio.sleep(0.1)
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        return tenancy.ring.identify(key) is not None

    return asyncio.run(run())


def test_the_watch_reloads_when_the_file_changes(tmp_path: Path) -> None:
    path = _file(tmp_path, TENANTS)
    tenancy = Tenancy(load_keyring(path, environ={}), FleetMetrics(), (path, None), environ={})

    def change() -> None:
        Path(path).write_text("keys:\n  - {name: a, key: changed}\n", encoding="utf-8")
        os.utime(path, ns=(1, 1))  # a new modification time even on a coarse clock

    assert _watch_until_known(tenancy, b"changed", change)


def test_sighup_reloads_an_unchanged_looking_file(tmp_path: Path) -> None:
    path = _file(tmp_path, TENANTS)
    tenancy = Tenancy(load_keyring(path, environ={}), FleetMetrics(), (path, None), environ={})
    stamp = os.stat(path)
    Path(path).write_text(TENANTS.replace("sk-test-1234", "sk-test-9999"), encoding="utf-8")  # the same size
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # and time: only the signal tells
    assert _watch_until_known(tenancy, b"sk-test-9999", lambda: os.kill(os.getpid(), signal.SIGHUP))


def test_the_keys_files_the_docs_show_are_valid(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL) if b.lstrip("# \n").startswith(
        "keys.yaml") or b.startswith("keys:")]
    assert blocks
    for block in blocks:
        assert load_keyring(_file(tmp_path, block), environ={}).names()


def _add_many(path: str, start: int, n: int, go: Any) -> None:
    go.wait()  # every writer starts at once
    for i in range(start, start + n):
        add_entry(Path(path), KeyEntry(name=f"t{i}", sha256=digest(f"sk-{i}").hex()))


def test_keys_added_at_once_from_several_processes_all_land(tmp_path: Path) -> None:
    """Each ``keys add`` reads the file, appends and replaces it: without a lock around that (and a temporary name of
    each writer's own) concurrent adds lose entries or fail renaming a shared temporary file. (Six writers released
    together, eight adds each: every run without the lock lost entries; each add parses the whole file, so more
    entries cost quadratic time.)"""
    path = tmp_path / "keys.yaml"
    ctx = multiprocessing.get_context("fork")
    writers, each = 6, 8
    go = ctx.Barrier(writers)
    procs = [ctx.Process(target=_add_many, args=(str(path), each * p, each, go)) for p in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * writers
    names = {t.name for t in load_keyring(str(path), environ={}).tenants.values()}
    assert names == {f"t{i}" for i in range(writers * each)}
    assert not [f.name for f in tmp_path.iterdir() if f.name.endswith(".partial")]


def test_keys_add_refuses_a_name_the_file_has(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    add_entry(path, KeyEntry(name="ci", key="sk-test-1234"))
    with pytest.raises(ApiKeysError, match="already has a tenant named 'ci'"):
        add_entry(path, KeyEntry(name="ci", key="sk-test-5678"))
