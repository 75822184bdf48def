"""The models in the hub cache: what ``llamafleet models`` lists and ``llamafleet rm`` removes.

The store is ``huggingface_hub``'s own cache (``HF_HUB_CACHE``), shared with every Hugging Face tool of the machine:
a model fetched by ``llamafleet pull`` is there for ``llama-server -hf`` too, and the other way round. Each GGUF model
of each cached commit is one entry (a split model's parts are one). Removing a model removes its files' links and
the blobs no other link uses, then the folders and refs left empty.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from llamafleet.model.header import GgufError, read_model_info
from llamafleet.model.hub import HubError, cache_root
from llamafleet.model.hub_ref import HubRef, PickError, pick_files, split_parts


@dataclass(frozen=True)
class Stored:
    """One cached GGUF model."""

    ref: str  # hf:ORG/REPO/FILE.gguf, the first part of a split model
    repo: str
    commit: str
    refs: tuple[str, ...]  # the branches and tags that pointed at its commit when fetched
    files: tuple[str, ...]
    size: int  # bytes, all parts
    quant: str  # the header's file type, e.g. Q4_K_M ("?" if the header cannot be read)
    path: Path  # what llama.cpp loads

    def matches(self, ref: HubRef) -> bool:
        """Whether ``ref`` names this model (by its files, at its commit or refs)."""
        if ref.repo != self.repo or (ref.revision and ref.revision not in (self.commit, *self.refs)):
            return False
        try:
            return pick_files(ref, self.files) == list(self.files)
        except PickError:
            return False


def stored() -> list[Stored]:
    """Every GGUF model in the hub cache, by repo and file."""
    try:
        repos = scan_cache_dir(cache_root()).repos
    except CacheNotFound:
        return []
    out = []
    for repo in repos:
        if repo.repo_type != "model":
            continue
        for rev in repo.revisions:
            sizes = {f.file_path.relative_to(rev.snapshot_path).as_posix(): f.size_on_disk for f in rev.files}
            groups: dict[str, list[str]] = {}
            for name in sorted(n for n in sizes if n.endswith(".gguf")):
                parts = split_parts(name)
                groups.setdefault(name if parts is None else f"{parts[0]}/{parts[2]}", []).append(name)
            for names in groups.values():
                first = rev.snapshot_path / names[0]
                try:
                    quant = read_model_info(first).file_type
                except GgufError:  # a part missing, or not a model
                    quant = "?"
                out.append(Stored(f"hf:{repo.repo_id}/{names[0]}", repo.repo_id, rev.commit_hash,
                                  tuple(sorted(rev.refs)), tuple(names), sum(sizes[n] for n in names), quant, first))
    return sorted(out, key=lambda s: (s.repo, s.ref, s.commit))


def remove(ref: HubRef) -> list[Stored]:
    """Remove the cached models ``ref`` names (at every cached commit unless it names one; ``hf:ORG/REPO``: all of
    the repo's); returns them. :class:`HubError` if the cache has none."""
    gone = [s for s in stored() if s.matches(ref)]
    if not gone:
        raise HubError(f"{ref}: the hub cache ({cache_root()}) holds no such model; `llamafleet models` lists it")
    for s in gone:
        _remove(s)
    return gone


def _remove(s: Stored) -> None:
    snapshot = s.path.parents[s.files[0].count("/")]
    repo_dir = snapshot.parent.parent
    for name in s.files:
        link = snapshot / name
        blob = link.resolve()
        link.unlink(missing_ok=True)
        others = [p for p in (repo_dir / "snapshots").rglob("*") if p.is_symlink() and p.resolve() == blob]
        if not others:
            blob.unlink(missing_ok=True)
    _prune(snapshot, s.commit, repo_dir)


def _prune(snapshot: Path, commit: str, repo_dir: Path) -> None:
    """Empty folders of a snapshot gone, the snapshot itself and its refs if no file is left, the repo if empty."""
    for folder in sorted((p for p in snapshot.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()
    if any(snapshot.iterdir()):
        return
    snapshot.rmdir()
    for ref_file in (repo_dir / "refs").rglob("*") if (repo_dir / "refs").is_dir() else ():
        if ref_file.is_file() and ref_file.read_text().strip() == commit:
            ref_file.unlink()
    if not any((repo_dir / "snapshots").iterdir()):
        shutil.rmtree(repo_dir)
