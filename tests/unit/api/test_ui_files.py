"""The dashboard's files ship in the wheel (pyproject's package data names them) and the server serves each one."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from llamafleet.api import ui

ROOT = Path(__file__).resolve().parents[3]
STATIC = ROOT / "src" / "llamafleet" / "api" / "static"


def test_every_static_file_is_package_data_and_served() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = sorted(p.name for p in STATIC.iterdir())
    assert {"index.html", "common.js", "dashboard.js", "playground.js", "dashboard.css"} <= set(files)
    for name in files:
        assert any(fnmatch.fnmatch(f"static/{name}", pat) for pat in patterns["llamafleet.api"]), name
    assert sorted(ui.FILES) == files


def test_the_page_loads_only_its_own_files() -> None:
    """No CDN, no inline script (the Content-Security-Policy forbids both): every script and stylesheet is ours."""
    page = (STATIC / "index.html").read_text()
    assert "<script>" not in page and "http://" not in page and "https://" not in page
    for ref in ("/ui/common.js", "/ui/dashboard.js", "/ui/playground.js", "/ui/dashboard.css"):
        assert ref in page
