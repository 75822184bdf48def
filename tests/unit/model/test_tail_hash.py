"""The sha256 of a download taken while it is written: right when it surely is the final file's, None otherwise."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

from llamafleet.model.tail_hash import TailHash

SIZE = 3 << 20


def writer(blobs: Path, data: bytes, sha: str) -> threading.Thread:
    """Write ``data`` as huggingface_hub does (ETAG.<random>.incomplete in pieces, then renamed to ETAG)."""

    def run() -> None:
        tmp = blobs / f"{sha}.x1.incomplete"
        with tmp.open("wb") as f:
            for i in range(0, len(data), 256 << 10):
                f.write(data[i:i + (256 << 10)])
                f.flush()
                time.sleep(0.002)
        os.replace(tmp, blobs / sha)

    return threading.Thread(target=run)


def test_the_digest_of_a_file_hashed_as_it_was_written(tmp_path: Path) -> None:
    data = os.urandom(SIZE)
    sha = hashlib.sha256(data).hexdigest()
    tail = TailHash(tmp_path, sha, SIZE)
    tail.start()
    w = writer(tmp_path, data, sha)
    w.start()
    w.join()
    assert tail.digest(tmp_path / sha) == sha


def test_no_digest_when_it_may_not_be_the_final_file(tmp_path: Path) -> None:
    data = os.urandom(SIZE)
    sha = hashlib.sha256(data).hexdigest()
    tail = TailHash(tmp_path, sha, SIZE)
    tail.start()
    tmp = tmp_path / f"{sha}.x1.incomplete"
    with tmp.open("wb") as f:
        f.write(data[: 1 << 20])
        f.flush()
        while tail.read < 1 << 20:
            time.sleep(0.001)
        f.seek(0)  # a server that ignored the resumed range sends the file again from its start
        f.truncate()
        deadline = time.monotonic() + 30
        while tail.valid and time.monotonic() < deadline:  # the reader sees the file shrink under it
            time.sleep(0.001)
        f.write(data)
    os.replace(tmp, tmp_path / sha)
    assert tail.digest(tmp_path / sha) is None
    (tmp_path / sha).unlink()
    for name in ("a", "b"):  # two writers at once: which one ends as the blob is not known
        (tmp_path / f"{sha}.{name}.incomplete").write_bytes(data[:10])
    tail = TailHash(tmp_path, sha, SIZE)
    tail.start()
    (tmp_path / f"{sha}.a.incomplete").unlink()
    os.replace(tmp_path / f"{sha}.b.incomplete", tmp_path / sha)
    assert tail.digest(tmp_path / sha) is None
    tail = TailHash(tmp_path, "0" * 64, SIZE)  # nothing was written: the download had nothing to do
    tail.start()
    assert tail.digest(tmp_path / sha) is None
