"""The sha256 of a download computed while it is written, so that checking it costs no time after it ends.

``huggingface_hub`` writes a download to ``BLOBS/ETAG.<random>.incomplete`` and renames it to ``BLOBS/ETAG`` when it
is whole; an LFS file's etag is its sha256. :class:`TailHash` follows that file from another thread, hashing what
has been written, and after the rename reads the rest from the same open file. Its digest counts only if it is the
final file's: the same inode as the blob, every byte read once, the file not seen to shrink (the library truncates
when a server ignores a resumed range and sends the file again from its start: bytes the reader had read may be
written again, the same ones unless the server changed them). Otherwise :meth:`digest` says None and the caller
hashes the blob; a digest that does not match is always confirmed by hashing the blob whole.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import BinaryIO

_POLL_S = 0.01
_CHUNK = 8 << 20


class TailHash(threading.Thread):
    """Hash the download of ``sha256`` into ``blobs`` while it is written (start before the download)."""

    def __init__(self, blobs: Path, sha256: str, size: int) -> None:
        super().__init__(name=f"tail-hash-{sha256[:8]}", daemon=True)
        self.blobs, self.sha256, self.size = blobs, sha256, size
        self.done = threading.Event()  # the download returned: stop waiting for a file to appear
        self.h = hashlib.sha256()
        self.read = 0
        self.valid = True
        self.inode: tuple[int, int] | None = None

    def run(self) -> None:
        f = self._find()
        if f is None:
            self.valid = False
            return
        with f:
            st = os.fstat(f.fileno())
            self.inode = (st.st_dev, st.st_ino)
            while self.read < self.size and self.valid:
                chunk = f.read(min(_CHUNK, self.size - self.read))
                if chunk:
                    self.h.update(chunk)
                    self.read += len(chunk)
                    continue
                if os.fstat(f.fileno()).st_size < self.read:  # truncated under us: the bytes read are not the file's
                    self.valid = False
                elif self.done.is_set() and os.fstat(f.fileno()).st_size == self.read:
                    break  # the download ended short of the size: not ours to judge
                else:
                    time.sleep(_POLL_S)

    def _find(self) -> BinaryIO | None:
        while not self.done.is_set():
            found = sorted(self.blobs.glob(f"{self.sha256}.*.incomplete")) if self.blobs.is_dir() else []
            if len(found) == 1:
                try:
                    return found[0].open("rb")
                except FileNotFoundError:  # renamed between the look and the open
                    pass
            elif len(found) > 1:  # several writers (a lock the filesystem does not honour): hash the result instead
                return None
            time.sleep(_POLL_S)
        return None

    def digest(self, blob: Path, timeout: float = 60.0) -> str | None:
        """After the download: the sha256 of ``blob`` if what was read is surely its content, else None."""
        self.done.set()
        self.join(timeout)
        if self.is_alive() or not self.valid or self.read != self.size or self.inode is None:
            return None
        st = blob.stat()
        if (st.st_dev, st.st_ino) != self.inode or st.st_size != self.size:
            return None
        return self.h.hexdigest()
