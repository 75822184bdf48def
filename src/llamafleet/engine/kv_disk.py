"""The disk tier of the KV cache: sequence states the RAM tier evicts, kept in files that survive restarts.

One folder per model and context shape under ``cache_dir`` (named by :func:`fingerprint`: the model file, the KV
type, the number of KV streams and llama.cpp's state format), so the replicas of one model share it and another
model, shape or llama.cpp build never sees its files. A file holds one state and the tokens it covers::

    b"LFKV" | u32 format | u32 n (JSON header) | header | n_tokens x i32 | state | sha256 of all before it

The header repeats the fingerprint and the state format: a file that does not match is never loaded. A file is
written under a temporary name and renamed into place (a reader sees a whole file or none; two replicas writing the
same entry write the same bytes, and the last rename wins). A file that is truncated or fails its checksum is deleted
when it is read, never loaded. The tier holds at most ``limit_bytes`` of files: the least recently used (file
modification time, touched on every use, so the order survives restarts) go first. A write that fails (full disk,
unwritable folder) turns the tier off with one warning; serving goes on without it.

The tokens of every file are indexed in memory at start, so a lookup reads no file; loading reads one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from llamafleet.engine.prefix import common_prefix

log = logging.getLogger(__name__)

MAGIC = b"LFKV"
FILE_FORMAT = 1
_HEAD = struct.Struct("<4sII")  # magic, file format, length of the JSON header
_DIGEST = 32  # sha256
_PROBE = 8 << 20  # bytes hashed from each end of the model file


def fingerprint(model_path: str, shape: str, state_format: str) -> str:
    """What a saved state depends on: the model file (its size and its first and last 8 MiB: the GGUF header with
    every tensor's name, type and offset, and some weights), the context's ``shape`` (KV type, streams) and
    llama.cpp's ``state_format``. Hex sha256."""
    h = hashlib.sha256(f"{shape}\0{state_format}\0".encode())
    size = os.path.getsize(model_path)
    h.update(str(size).encode())
    with open(model_path, "rb") as f:
        h.update(f.read(_PROBE))
        f.seek(max(0, size - _PROBE))
        h.update(f.read(_PROBE))
    return h.hexdigest()


def entry_name(tokens: list[int]) -> str:
    """A state's file name: the hash of the tokens it covers (so every replica names one prefix alike)."""
    return hashlib.sha256(array("i", tokens).tobytes()).hexdigest()[:40] + ".kv"


@dataclass
class DiskEntry:
    tokens: list[int]
    size: int  # bytes of the file


class DiskTier:
    """The files of one model and shape under ``root`` (see the module docstring)."""

    def __init__(self, root: str, model_path: str, fp: str, state_format: str, limit_bytes: int) -> None:
        self.fp, self.state_format, self.limit_bytes = fp, state_format, limit_bytes
        self.dir = Path(root) / f"{Path(model_path).stem[:48]}-{fp[:16]}"
        self.on = True
        self.bytes = 0
        self.evictions = 0
        self.dropped = 0  # files found damaged (truncated, wrong checksum) and deleted
        self._index: OrderedDict[str, DiskEntry] = OrderedDict()  # least recently used first
        self._seen = 0  # the folder's modification time when it was last indexed
        self._seq = 0
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self._off(e)
            return
        self._scan()
        if self._index:
            log.info("disk KV tier %s: %d states, %.1f MiB", self.dir, len(self._index), self.bytes / 2**20)

    # -- reading -------------------------------------------------------------------------------------------------
    def _scan(self) -> None:
        """Index the folder's files: at start, and again whenever the folder changed (another replica of the model
        wrote or deleted a file: its states serve this replica too, and the bound holds for all of them)."""
        try:
            self._seen = self.dir.stat().st_mtime_ns
            names = {p.name for p in self.dir.glob("*.kv")}
        except OSError:
            return
        for gone in [n for n in self._index if n not in names]:
            self._forget(gone)
        found: list[tuple[float, str, DiskEntry]] = []
        for name in names - set(self._index):
            path = self.dir / name
            try:
                st = path.stat()
                with path.open("rb") as f:
                    tokens = self._read_head(f)
                if tokens is None:
                    self._drop(path, "its header is damaged or from another model or llama.cpp")
                    continue
                found.append((st.st_mtime, name, DiskEntry(tokens, st.st_size)))
            except OSError:
                continue  # vanished (another replica evicted it) or unreadable: not ours to use
        for _, name, e in sorted(found, key=lambda x: x[0]):
            self._index[name] = e
            self.bytes += e.size
        self._evict()

    def _refresh(self) -> None:
        """Index again if the folder changed since: its modification time moved, or is too recent to tell (file
        times advance in coarse ticks, so a change in the same tick as the last look would not show)."""
        with contextlib.suppress(OSError):
            changed = self.dir.stat().st_mtime_ns
            if changed != self._seen or time.time_ns() - changed < 1_000_000_000:
                self._scan()

    def _read_head(self, f: BinaryIO) -> list[int] | None:
        """The tokens of an open file, positioned after them; None if the header is not ours."""
        read = f.read
        raw = read(_HEAD.size)
        if len(raw) != _HEAD.size:
            return None
        magic, fmt, n = _HEAD.unpack(raw)
        if magic != MAGIC or fmt != FILE_FORMAT or n > 1 << 16:
            return None
        try:
            head = json.loads(read(n))
            n_tokens, state_bytes = int(head["n_tokens"]), int(head["state_bytes"])
        except (ValueError, KeyError, TypeError):
            return None
        if head.get("fingerprint") != self.fp or head.get("state_format") != self.state_format or state_bytes < 0:
            return None
        body = read(4 * n_tokens)
        if len(body) != 4 * n_tokens:
            return None
        return array("i", body).tolist()

    def best(self, prompt: list[int], cap: int) -> tuple[str | None, int]:
        """The file holding the longest prefix of ``prompt`` (at most ``cap`` tokens), and its length."""
        self._refresh()
        best: tuple[str | None, int] = (None, 0)
        for name, e in self._index.items():
            n = common_prefix(prompt, e.tokens, cap)
            if n > best[1]:
                best = (name, n)
        return best

    def held(self, name: str) -> int:
        """How many tokens file ``name`` holds (0: no such file)."""
        e = self._index.get(name)
        return 0 if e is None else len(e.tokens)

    def covers(self, tokens: list[int]) -> bool:
        """Whether a file already holds ``tokens`` (or a longer sequence starting with them)."""
        return any(len(e.tokens) >= len(tokens) and e.tokens[:len(tokens)] == tokens for e in self._index.values())

    def load(self, name: str) -> bytearray | None:
        """The state in file ``name``, checked whole; a damaged file is deleted and None returned."""
        e = self._index.get(name)
        if e is None:
            return None
        path = self.dir / name
        try:
            data = path.read_bytes()
        except OSError:
            self._forget(name)
            return None
        state = self._check(data, e)
        if state is None:
            self._drop(path, "it is truncated or fails its checksum")
            self._forget(name)
            return None
        self._index.move_to_end(name)
        with contextlib.suppress(OSError):
            os.utime(path)
        return state

    def _check(self, data: bytes, e: DiskEntry) -> bytearray | None:
        if len(data) < _HEAD.size + _DIGEST or hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
            return None
        _, _, n = _HEAD.unpack_from(data)
        head = json.loads(data[_HEAD.size:_HEAD.size + n])
        start = _HEAD.size + n + 4 * len(e.tokens)
        state = bytearray(data[start:-_DIGEST])
        return state if len(state) == int(head["state_bytes"]) else None

    # -- writing -------------------------------------------------------------------------------------------------
    def put(self, tokens: list[int], state: bytearray | memoryview) -> bool:
        """Write ``state`` (holding ``tokens``) as a file; files it makes obsolete (prefixes of ``tokens``) and the
        least recently used beyond the bound are deleted. False if the tier is off or the write failed."""
        if not self.on:
            return False
        if self.covers(tokens):
            return True
        name = entry_name(tokens)
        head = json.dumps({"fingerprint": self.fp, "state_format": self.state_format, "n_tokens": len(tokens),
                           "state_bytes": len(state)}).encode()
        h = hashlib.sha256()
        parts = (_HEAD.pack(MAGIC, FILE_FORMAT, len(head)), head, array("i", tokens).tobytes(), state)
        for p in parts:
            h.update(p)
        size = sum(len(p) for p in parts) + _DIGEST
        if size > self.limit_bytes:
            return False
        self._seq += 1
        tmp = self.dir / f".{name}.{os.getpid()}.{self._seq}.tmp"
        try:
            with tmp.open("wb") as f:
                for p in (*parts, h.digest()):
                    f.write(p)
            os.replace(tmp, self.dir / name)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            self._off(e)
            return False
        for old in [k for k, x in self._index.items() if len(x.tokens) < len(tokens)
                    and tokens[:len(x.tokens)] == x.tokens]:
            self._delete(old)
        self._index[name] = DiskEntry(list(tokens), size)
        self.bytes += size
        self._evict()
        return True

    def _evict(self) -> None:
        while self.bytes > self.limit_bytes and self._index:
            self._delete(next(iter(self._index)))
            self.evictions += 1

    def _delete(self, name: str) -> None:
        self._forget(name)
        with contextlib.suppress(OSError):
            (self.dir / name).unlink(missing_ok=True)

    def _forget(self, name: str) -> None:
        e = self._index.pop(name, None)
        if e is not None:
            self.bytes -= e.size

    def _drop(self, path: Path, why: str) -> None:
        self.dropped += 1
        log.warning("disk KV tier: dropping %s: %s", path.name, why)
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)

    def _off(self, e: OSError) -> None:
        if self.on:
            log.warning("disk KV tier %s turned off: %s (serving goes on with the RAM tier; free space or fix "
                        "the folder's permissions, then restart)", self.dir, e)
        self.on = False

    def names(self) -> list[str]:
        """The files indexed now (as last scanned)."""
        return list(self._index)

    @property
    def entries(self) -> int:
        return len(self._index)
