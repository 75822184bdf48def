"""The disk tier's files: written whole or not at all, checked before use, bounded, shared by replicas, and
ignored when they come from another model or llama.cpp build. Real files in a temporary folder; no llama.cpp."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from llamafleet.engine.kv_disk import DiskTier, entry_name, fingerprint

FORMAT = "test state format"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    return p


def tier(root: Path, model: Path, limit: int = 1 << 20, fmt: str = FORMAT) -> DiskTier:
    return DiskTier(str(root), str(model), fingerprint(str(model), "shape", fmt), fmt, limit)


def state(n: int, fill: int = 7) -> bytearray:
    return bytearray([fill]) * n


def test_a_state_survives_a_restart_and_is_found_by_its_prefix(tmp_path: Path, model: Path) -> None:
    root = tmp_path / "kv"
    a = tier(root, model)
    tokens = list(range(100, 200))
    assert a.put(tokens, state(5000))
    b = tier(root, model)  # a new process: the index is read back from the files
    assert b.entries == 1
    name, n = b.best([*tokens[:60], 999, 1000], cap=61)
    assert (name, n) == (entry_name(tokens), 60)
    assert b.load(name) == state(5000)
    assert not [p for p in b.dir.iterdir() if p.name.endswith(".tmp")]  # written under a temporary name, renamed


def test_a_damaged_file_is_dropped_never_loaded(tmp_path: Path, model: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    a = tier(tmp_path, model)
    one, two = list(range(50)), list(range(1000, 1050))
    a.put(one, state(3000, 1))
    a.put(two, state(3000, 2))
    p1, p2 = a.dir / entry_name(one), a.dir / entry_name(two)
    p1.write_bytes(p1.read_bytes()[:-100])  # truncated
    raw = bytearray(p2.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte
    p2.write_bytes(bytes(raw))
    b = tier(tmp_path, model)
    with caplog.at_level(logging.WARNING):
        assert b.load(entry_name(one)) is None
        assert b.load(entry_name(two)) is None
    assert not p1.exists() and not p2.exists() and b.entries == 0 and b.dropped == 2
    assert b.best(one, 49) == (None, 0)


def test_files_of_another_model_or_llama_cpp_are_not_used(tmp_path: Path, model: Path) -> None:
    a = tier(tmp_path, model)
    a.put(list(range(40)), state(100))
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + bytes(300))
    assert tier(tmp_path, other).entries == 0  # another model: another folder
    b = tier(tmp_path, model, fmt="another llama.cpp")
    assert b.entries == 0 and b.dir != a.dir
    # a file of another build placed in this folder by hand is dropped at start, not loaded
    os.replace(a.dir / entry_name(list(range(40))), b.dir / entry_name(list(range(40))))
    assert tier(tmp_path, model, fmt="another llama.cpp").entries == 0


def test_the_bound_evicts_the_least_recently_used(tmp_path: Path, model: Path) -> None:
    a = tier(tmp_path, model, limit=25_000)
    runs = [list(range(i * 100, i * 100 + 50)) for i in range(3)]
    a.put(runs[0], state(10_000))
    a.put(runs[1], state(10_000))
    assert a.load(entry_name(runs[0])) is not None  # used: now the most recent
    a.put(runs[2], state(10_000))
    assert a.bytes <= 25_000 and a.evictions == 1
    assert {p.name for p in a.dir.glob("*.kv")} == {entry_name(runs[0]), entry_name(runs[2])}
    assert not a.put(list(range(7000, 7050)), state(30_000))  # larger than the whole tier: not written


def test_a_longer_state_replaces_its_prefixes_and_a_covered_one_is_not_written(tmp_path: Path,
                                                                                model: Path) -> None:
    a = tier(tmp_path, model)
    a.put(list(range(40)), state(100))
    a.put(list(range(80)), state(200))
    assert a.entries == 1 and a.covers(list(range(60)))
    assert a.put(list(range(50)), state(100)) and a.entries == 1


def test_two_replicas_writing_the_same_entry(tmp_path: Path, model: Path) -> None:
    a, b = tier(tmp_path, model), tier(tmp_path, model)
    tokens = list(range(64))
    assert a.put(tokens, state(4000, 3)) and b.put(tokens, state(4000, 3))
    assert tier(tmp_path, model).load(entry_name(tokens)) == state(4000, 3)
    assert len(list(a.dir.iterdir())) == 1


def test_an_unwritable_folder_turns_the_tier_off_with_one_warning(tmp_path: Path, model: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        assert not tier(blocker / "kv", model).on  # the folder cannot be made
        a = tier(tmp_path / "kv", model)
        a.put(list(range(40)), state(100))
        for p in a.dir.iterdir():  # the folder goes away under the running tier (root can write anywhere, so
            p.unlink()  # a read-only mode would not stop the test's own user)
        a.dir.rmdir()
        a.dir.write_text("now a file")
        assert not a.put(list(range(50, 90)), state(100))
        assert not a.put(list(range(100, 140)), state(100))
    assert not a.on
    assert len([r for r in caplog.records if "turned off" in r.getMessage()]) == 2  # once per tier


def test_a_replica_finds_what_another_replica_of_the_model_wrote(tmp_path: Path, model: Path) -> None:
    a, b = tier(tmp_path, model), tier(tmp_path, model)
    tokens = list(range(300, 400))
    a.put(tokens, state(2000, 5))
    name, n = b.best(tokens + [1], cap=100)  # the folder changed: b indexes a's new file
    assert n == 100 and b.load(name or "") == state(2000, 5)
    (b.dir / (name or "")).unlink()  # gone (a's bound, an operator): a forgets it at its next look
    assert a.best(tokens + [1], cap=100) == (None, 0) and a.bytes == 0
