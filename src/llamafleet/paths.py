"""Where llamafleet keeps files it fetches or builds: one cache folder, overridable with ``LLAMAFLEET_CACHE``."""

from __future__ import annotations

import os
from pathlib import Path

LLAMA_CPP_VERSION = "0.3.36"


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


def llama_cpp_sdist_dir() -> Path:
    """Where scripts/install.sh keeps the llama-cpp-python sdist it builds from (also the LLaMA-2 vocab's source)."""
    return cache_dir() / "sdist"
