"""Where llamafleet keeps files it fetches or builds: one cache folder, overridable with ``LLAMAFLEET_CACHE``.

Also the llama-cpp-python version llamafleet is pinned to. pyproject.toml is the one place it is written:
installed, it is read back from the package metadata; in a source tree that was never installed, from
pyproject.toml itself (scripts/install.sh and scripts/gpu-bench.sh read that file too).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import tomllib
import uuid
from pathlib import Path

_PIN = re.compile(r"^llama[-_.]cpp[-_.]python\s*==\s*([\w.]+)", re.IGNORECASE)


def llama_cpp_pin(requirements: list[str]) -> str:
    """The version of the ``llama-cpp-python==X`` requirement among ``requirements``."""
    for text in requirements:
        if m := _PIN.match(text.strip()):
            return m.group(1)
    raise RuntimeError("llamafleet's requirements have no llama-cpp-python==VERSION pin (see pyproject.toml)")


def _requirements() -> list[str]:
    try:
        return md.requires("llamafleet") or []
    except md.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        deps: list[str] = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
        return deps


LLAMA_CPP_VERSION = llama_cpp_pin(_requirements())


def cache_dir() -> Path:
    """``$LLAMAFLEET_CACHE``, else ``$XDG_CACHE_HOME/llamafleet``, else ``~/.cache/llamafleet`` (created)."""
    env = os.environ.get("LLAMAFLEET_CACHE")
    if env:
        base = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "llamafleet"
    base.mkdir(parents=True, exist_ok=True)
    return base


def partial_path(target: Path) -> Path:
    """A temporary name beside ``target`` that no other process or thread writing ``target`` at the same time uses:
    write there, then ``os.replace`` it onto ``target`` (a fixed name would be truncated and renamed under the
    other writer)."""
    return target.with_name(f"{target.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.partial")


def llama_cpp_sdist_dir() -> Path:
    """Where scripts/install.sh keeps the llama-cpp-python sdist it builds from (also the LLaMA-2 vocab's source)."""
    return cache_dir() / "sdist"
