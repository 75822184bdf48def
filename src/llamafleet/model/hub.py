"""Models on the Hugging Face hub, through ``huggingface_hub`` (its cache, ``HF_ENDPOINT``, ``HF_TOKEN``,
``HF_HUB_OFFLINE``, locks and resumed transfers).

Three steps, so that a model is planned before its weights are fetched:

1. :func:`resolve`: the reference (:mod:`llamafleet.model.hub_ref`) against the repo's file list at a commit, with
   each file's size and LFS sha256 (one API call). Offline (``HF_HUB_OFFLINE``, or the hub unreachable), the cache's
   copy of the repo answers instead, if it has the file.
2. :func:`header`: the model's header read with ranged requests (a few MB of a 40 GB file), for the planner.
3. :func:`fetch`: the files downloaded into the cache (refused first when the disk would fill), each new one checked
   against its sha256 (hashed while it is written: :mod:`llamafleet.model.tail_hash`).

A resolved model's path is known before it is downloaded (the cache's snapshot path), so a plan made from its
header names the file its replicas will load.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import httpx2
from huggingface_hub import HfApi, HfFileSystem, constants, hf_hub_download, scan_cache_dir, try_to_load_from_cache
from huggingface_hub.errors import (
    CacheNotFound,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import repo_folder_name
from tqdm import tqdm

from llamafleet.model.hub_ref import HubRef, PickError, is_ref, parse_ref, pick_files
from llamafleet.model.tail_hash import TailHash

if TYPE_CHECKING:  # the header's reader loads gguf and numpy, which `pull` does not need
    from llamafleet.model.header import ModelInfo

log = logging.getLogger(__name__)

HEADER_BLOCK = 2 << 20  # bytes per ranged read of a header: the metadata and tensor table of most models


class HubError(RuntimeError):
    """A hub model that cannot be resolved, read or fetched; the message names the reference and what to do."""


class NoSpace(HubError):
    """A download that would not fit on the cache's disk."""


@dataclass(frozen=True)
class HubFile:
    name: str  # its path inside the repo
    size: int
    sha256: str | None  # the LFS object's; None for a file kept in git, or one resolved offline


@dataclass(frozen=True)
class Resolved:
    """A reference pinned to a commit: the files to fetch (a split model's first part first) and where they go."""

    ref: HubRef
    commit: str
    files: tuple[HubFile, ...]
    offline: bool  # answered by the cache (HF_HUB_OFFLINE, or the hub unreachable)

    @property
    def snapshot(self) -> Path:
        return cache_root() / repo_folder_name(repo_id=self.ref.repo, repo_type="model") / "snapshots" / self.commit

    @property
    def path(self) -> Path:
        """The first file's path once fetched: what llama.cpp loads."""
        return self.snapshot / self.files[0].name

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def missing(self) -> list[HubFile]:
        """The files not in the cache yet."""
        return [f for f in self.files
                if not isinstance(try_to_load_from_cache(self.ref.repo, f.name, revision=self.commit), str)]


def cache_root() -> Path:
    """The hub cache every Hugging Face tool of this machine shares (``HF_HUB_CACHE``, ``HF_HOME``)."""
    return Path(constants.HF_HUB_CACHE)


def endpoint() -> str:
    return constants.ENDPOINT


@contextmanager
def hub_errors(ref: HubRef) -> Iterator[None]:
    """The library's errors as :class:`HubError`: what went wrong with ``ref`` and what would fix it."""
    try:
        yield
    except GatedRepoError:
        raise HubError(f"{ref}: {ref.repo} is a gated repo and this request had no access to it: accept its terms on "
                       "the hub, then set HF_TOKEN to a token of that account (or run `hf auth login`)") from None
    except RepositoryNotFoundError:
        raise HubError(f"{ref}: no repo {ref.repo} at {endpoint()} (a private or gated one needs HF_TOKEN set to a "
                       "token with access)") from None
    except RevisionNotFoundError:
        raise HubError(f"{ref}: {ref.repo} has no revision {ref.revision!r} (a branch, tag or commit)") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        raise HubError(f"{ref}: the hub at {endpoint()} answered {status} ({str(e).splitlines()[0]})") from None
    except (httpx2.TransportError, LocalEntryNotFoundError) as e:
        raise HubError(f"{ref}: the hub at {endpoint()} cannot be reached ({e}), and the cache has no copy; check the "
                       "network or HF_ENDPOINT, or fetch it where the hub is reachable (`llamafleet pull`)") from None


def resolve(ref: HubRef) -> Resolved:
    """The files ``ref`` names at its revision, with sizes and sha256s; the cache's copy when offline or the hub
    cannot be reached. :class:`HubError` if it cannot be asked, or the repo has no such file (or several)."""
    if constants.is_offline_mode():
        return _cached(ref, "HF_HUB_OFFLINE is set")
    with hub_errors(ref):
        try:
            info = HfApi().model_info(ref.repo, revision=ref.revision, files_metadata=True)
        except httpx2.TransportError as e:
            return _cached(ref, f"the hub at {endpoint()} cannot be reached ({e})")
    files = {s.rfilename: s for s in info.siblings or ()}
    if info.sha is None:
        raise HubError(f"{ref}: the hub at {endpoint()} names no commit for {ref.repo}; is HF_ENDPOINT a hub?")
    try:
        picked = [files[name] for name in pick_files(ref, files)]
    except PickError as e:
        raise HubError(str(e)) from None
    return Resolved(ref, info.sha, tuple(HubFile(s.rfilename, s.lfs.size if s.lfs else s.size or 0,
                                                 s.lfs.sha256 if s.lfs else None) for s in picked), offline=False)


def _cached(ref: HubRef, why: str) -> Resolved:
    """The cache's copy of ``ref`` (its branch's or tag's last fetched commit, or the commit named)."""
    wanted = ref.revision or "main"
    try:
        repos = scan_cache_dir(cache_root()).repos
    except CacheNotFound:
        repos = frozenset()
    for repo in repos:
        if repo.repo_type != "model" or repo.repo_id != ref.repo:
            continue
        for rev in repo.revisions:
            if wanted != rev.commit_hash and wanted not in rev.refs:
                continue
            sizes = {f.file_path.relative_to(rev.snapshot_path).as_posix(): f.size_on_disk for f in rev.files}
            try:
                names = pick_files(ref, sizes)
            except PickError:
                continue
            log.warning("%s: %s; using the cached copy (commit %s)", ref, why, rev.commit_hash[:12])
            return Resolved(ref, rev.commit_hash, tuple(HubFile(n, sizes[n], None) for n in names), offline=True)
    raise HubError(f"{ref}: {why}, and the cache ({cache_root()}) holds no copy of it; fetch it where the hub is "
                   "reachable (`llamafleet pull`), or check the network or HF_ENDPOINT")


def model_header(source: str | Path) -> tuple[ModelInfo, Resolved | None]:
    """What a model path given by a user describes: a local file's header (or a checkpoint folder's), or a hub
    reference's (resolved, read from the hub without its weights) with its resolution, for :func:`fetch` once the
    plan fits."""
    from llamafleet.model.checkpoint import describe

    if not is_ref(str(source)):
        return describe(source), None
    resolved = resolve(parse_ref(str(source)))
    return header(resolved), resolved


def header(resolved: Resolved) -> ModelInfo:
    """The model's header, for the planner: from the cache when fetched, else read from the hub with ranged
    requests (no weights). Its ``path`` is where the model will be once fetched."""
    from llamafleet.model.header import read_model_info

    if not resolved.missing():
        return read_model_info(resolved.path)
    sizes = {f.name: f.size for f in resolved.files}
    fs = HfFileSystem()

    def opener(name: str) -> tuple[BinaryIO, int]:
        file = Path(name).relative_to(resolved.snapshot).as_posix()
        f: BinaryIO = fs.open(f"{resolved.ref.repo}/{file}", "rb", revision=resolved.commit, block_size=HEADER_BLOCK)
        return f, sizes[file]

    with hub_errors(resolved.ref):
        return read_model_info(resolved.path, opener)


def fetch(resolved: Resolved, progress: type[tqdm[Any]] | None = None) -> Path:
    """Download what the cache lacks (refused first if the disk would fill) and return the first file's path.
    ``progress``: the bar class (tqdm's own by default; :class:`llamafleet.model.hub_progress.LogProgress` for a
    server's log)."""
    missing = resolved.missing()
    check_space(resolved.ref, sum(f.size for f in missing))
    for f in resolved.files:
        tail = None
        if f in missing and f.sha256 is not None:  # hashed while it is written
            tail = TailHash(resolved.snapshot.parent.parent / "blobs", f.sha256, f.size)
            tail.start()
        try:
            # by the branch or tag named, so that the cache records where it pointed (for offline use later)
            with hub_errors(resolved.ref):
                path = Path(hf_hub_download(resolved.ref.repo, f.name, revision=resolved.ref.revision or "main",
                                            tqdm_class=progress, local_files_only=resolved.offline))
        finally:
            if tail is not None:
                tail.done.set()
        if path != resolved.snapshot / f.name:
            raise HubError(f"{resolved.ref}: the repo moved to another commit while it was fetched; fetch it again")
        if tail is not None:
            _verify(resolved.ref, path, f, tail.digest(path.resolve()))
    return resolved.path


def check_space(ref: HubRef, need: int) -> None:
    """:class:`HubError` if ``need`` bytes would not fit on the cache's disk."""
    if need <= 0:
        return
    root = cache_root()
    where = next(p for p in (root, *root.parents) if p.exists())
    free = shutil.disk_usage(where).free
    if need > free:
        raise NoSpace(f"{ref}: the download needs {gib(need)} and the disk of the hub cache ({root}) has {gib(free)} "
                       f"free; free {gib(need - free)} more, or set HF_HUB_CACHE to a folder on a larger disk")


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _verify(ref: HubRef, path: Path, f: HubFile, digest: str | None) -> None:
    """Check a fresh download against the hub's LFS sha256 (``digest``: as hashed while it was written, None if it
    could not be); a file that does not match is deleted."""
    if digest != f.sha256:
        digest = sha256_of(path)  # hashed again whole: a mismatch is never decided by the tail hash alone
    if digest != f.sha256:
        blob = path.resolve()
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise HubError(f"{ref}: {f.name} does not match the hub's sha256 (got {digest}, expected {f.sha256}); the "
                       "download was deleted. Fetch it again; if it fails again, the hub or a proxy serves a "
                       "corrupted file")
