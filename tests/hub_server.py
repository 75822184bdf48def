"""A small Hugging Face hub on loopback, for tests: the endpoints ``huggingface_hub`` calls, answered as the hub
answers them, with faults on request.

- ``GET /api/models/ORG/REPO[/revision/REV]`` (``?blobs=true``: sizes and LFS sha256s), ``GET .../tree/REV[/PATH]``,
  ``POST .../paths-info/REV``: the repo's files at a commit; an unknown repo is 404 ``X-Error-Code: RepoNotFound``,
  an unknown revision 404 ``RevisionNotFound``.
- ``HEAD``/``GET /ORG/REPO/resolve/REV/PATH``: the file, with ``X-Repo-Commit``, ``ETag`` / ``X-Linked-Etag`` (its
  sha256, as for an LFS file), ``X-Linked-Size``, ``Accept-Ranges``; a ``Range`` is answered 206 with
  ``Content-Range``. A gated repo answers 401 ``X-Error-Code: GatedRepo`` to a request without its token (its
  model info stays readable, as on the hub).

Faults: ``drop_after[path] = n`` closes the connection after ``n`` body bytes of the next full GET of that file
(once); ``corrupt`` (a set of paths) serves the file with its last byte changed; ``rate`` limits the bytes per second
of whole-file GETs (downloads; not the ranged reads of headers). ``served[path]`` counts the body bytes sent for each
file, ``bytes_out`` every body byte, ``ranges`` the ``Range`` of each ranged GET of a file.

Files larger than ``HASH_LIMIT`` (sparse synthetic models) get a made-up sha256: tests never download them.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

HASH_LIMIT = 1 << 30


@dataclass
class Repo:
    commits: dict[str, dict[str, Path]] = field(default_factory=dict)  # commit -> path in repo -> file
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    gated: bool = False


def _sha256(path: Path) -> str:
    size = path.stat().st_size
    if size > HASH_LIMIT:
        return hashlib.sha256(f"{path}:{size}".encode()).hexdigest()
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


class LocalHub:
    """``with LocalHub() as hub: hub.add("org/repo", {"m-Q4_K_M.gguf": path}); os.environ["HF_ENDPOINT"] = hub.url``"""

    def __init__(self, token: str = "hf_test_token") -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.shas: dict[Path, str] = {}
        self.drop_after: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.rate: float | None = None  # bytes per second of whole-file GETs, None: as fast as it goes
        self.served: Counter[str] = Counter()
        self.bytes_out = 0
        self.requests: list[str] = []
        self.ranges: list[str] = []  # the Range header of each ranged GET of a file
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LocalHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add(self, repo: str, files: dict[str, Path], revision: str = "main", gated: bool = False) -> str:
        """Publish ``files`` (path in repo -> local file) as ``repo`` at ``revision``; returns the commit."""
        r = self.repos.setdefault(repo, Repo())
        r.gated = r.gated or gated
        commit = hashlib.sha1(f"{repo}@{revision}:{sorted(files)}".encode()).hexdigest()
        r.commits[commit] = dict(files)
        r.refs[revision] = commit
        for p in files.values():
            if p not in self.shas:
                self.shas[p] = _sha256(p)
        return commit

    def reset_counts(self) -> None:
        with self.lock:
            self.served.clear()
            self.bytes_out = 0
            self.requests.clear()
            self.ranges.clear()

    def entry(self, name: str, path: Path, full: bool) -> dict[str, object]:
        size, sha = path.stat().st_size, self.shas[path]
        blob = hashlib.sha1(f"{name}:{sha}".encode()).hexdigest()
        lfs = {"size": size, "pointerSize": 134}
        if full:
            return {"rfilename": name, "size": size, "blobId": blob, "lfs": lfs | {"sha256": sha}}
        return {"type": "file", "path": name, "size": size, "oid": blob, "lfs": lfs | {"oid": sha}}


def _handler(hub: LocalHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:  # noqa: N802
            self._route(body=False)

        def do_GET(self) -> None:  # noqa: N802
            self._route(body=True)

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(n).decode()) if n else {}
            self._route(body=True, form=form)

        def _route(self, body: bool, form: dict[str, list[str]] | None = None) -> None:
            url = urlsplit(self.path)
            words = [unquote(w) for w in url.path.strip("/").split("/")]
            with hub.lock:
                hub.requests.append(f"{self.command} {url.path}")
            if len(words) >= 4 and words[0] == "api" and words[1] == "models":
                self._api(words[2:], parse_qs(url.query), form, body)
            elif len(words) >= 5 and words[2] == "resolve":
                self._file(f"{words[0]}/{words[1]}", unquote(words[3]), "/".join(words[4:]), body)
            else:
                self._error(404, "EntryNotFound", "no such route")

        def _commit(self, repo: str, rev: str | None) -> tuple[Repo, str, dict[str, Path]] | None:
            r = hub.repos.get(repo)
            if r is None:
                self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}")
                return None
            commit = r.refs.get(rev or "main", rev or "main")
            if commit not in r.commits:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return None
            return r, commit, r.commits[commit]

        def _api(self, words: list[str], query: dict[str, list[str]], form: dict[str, list[str]] | None,
                 body: bool) -> None:
            repo, rest = f"{words[0]}/{words[1]}", words[2:]
            rev = unquote(rest[1]) if len(rest) >= 2 else None
            found = self._commit(repo, rev)
            if found is None:
                return
            r, commit, files = found
            if not rest or rest[0] == "revision":
                full = query.get("blobs") == ["True"] or query.get("blobs") == ["true"]
                siblings = [hub.entry(n, p, True) if full else {"rfilename": n} for n, p in sorted(files.items())]
                self._json({"id": repo, "modelId": repo, "sha": commit, "private": False,
                            "gated": "manual" if r.gated else False, "disabled": False, "siblings": siblings}, body)
            elif rest[0] == "tree":
                prefix = "/".join(rest[2:])
                recursive = query.get("recursive") == ["True"] or query.get("recursive") == ["true"]
                self._json(_tree(hub, files, prefix, recursive), body)
            elif rest[0] == "paths-info":
                wanted = (form or {}).get("paths", [])
                self._json([hub.entry(n, files[n], False) for n in wanted if n in files], body)
            else:
                self._error(404, "EntryNotFound", "no such route")

        def _file(self, repo: str, rev: str, name: str, body: bool) -> None:
            found = self._commit(repo, rev)
            if found is None:
                return
            r, commit, files = found
            if r.gated and self.headers.get("authorization") != f"Bearer {hub.token}":
                self._error(401, "GatedRepo", "Access to model is restricted. You must have access to it and be "
                            "authenticated to access it. Please log in.")
                return
            path = files.get(name)
            if path is None:
                self._error(404, "EntryNotFound", f"{name} does not exist on {rev}", commit)
                return
            size, sha = path.stat().st_size, hub.shas[path]
            start, end, status = 0, size - 1, 200
            ranged = self.headers.get("Range")
            if ranged and ranged.startswith("bytes="):
                a, _, b = ranged[6:].partition("-")
                start, end, status = int(a or 0), min(int(b) if b else size - 1, size - 1), 206
                if body:
                    with hub.lock:
                        hub.ranges.append(ranged)
            self.send_response(status)
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{hashlib.sha1(sha.encode()).hexdigest()}"')
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(size))
            self.send_header("Content-Type", "application/octet-stream")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            if body:
                self._send_file(name, path, start, end, status == 200)

        def _send_file(self, name: str, path: Path, start: int, end: int, whole: bool) -> None:
            with hub.lock:
                drop = hub.drop_after.pop(name, None) if whole else None
            last = path.stat().st_size - 1
            with path.open("rb") as f:
                f.seek(start)
                pos = start
                while pos <= end:
                    n = min(1 << 20, end - pos + 1)
                    if drop is not None:
                        n = min(n, start + drop - pos)
                    chunk = f.read(n)
                    if name in hub.corrupt and pos <= last < pos + len(chunk):
                        chunk = chunk[:-1] + bytes([chunk[-1] ^ 0xFF])
                    try:
                        self.wfile.write(chunk)
                    except OSError:
                        return
                    pos += len(chunk)
                    with hub.lock:
                        hub.served[name] += len(chunk)
                        hub.bytes_out += len(chunk)
                    if drop is not None and pos >= start + drop:
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    if hub.rate and whole:
                        time.sleep(len(chunk) / hub.rate)

        def _json(self, data: object, body: bool) -> None:
            raw = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if body:
                self.wfile.write(raw)
                with hub.lock:
                    hub.bytes_out += len(raw)

        def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
            raw = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

    return Handler


def _tree(hub: LocalHub, files: dict[str, Path], prefix: str, recursive: bool) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    folders: set[str] = set()
    base = f"{prefix}/" if prefix else ""
    for name, path in sorted(files.items()):
        if not name.startswith(base):
            continue
        rest = name[len(base):]
        if "/" in rest and not recursive:
            folders.add(base + rest.split("/", 1)[0])
            continue
        out.append(hub.entry(name, path, False))
    out += [{"type": "directory", "path": f, "oid": hashlib.sha1(f.encode()).hexdigest(), "size": 0}
            for f in sorted(folders)]
    return out


def main() -> None:
    """``python tests/hub_server.py ORG/REPO FILE...``: serve the files as that repo; prints the URL, runs until
    killed (for scripts/hub_bench.py: the hub in its own process, as a real one is)."""
    import sys

    repo, *files = sys.argv[1:]
    with LocalHub() as hub:
        hub.add(repo, {Path(f).name: Path(f) for f in files})
        print(hub.url, flush=True)
        hub.thread.join()


if __name__ == "__main__":
    main()
