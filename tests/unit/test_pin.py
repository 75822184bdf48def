"""The llama-cpp-python pin is written once, in pyproject.toml: the package and both shell scripts read it there."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from llamafleet.paths import LLAMA_CPP_VERSION, llama_cpp_pin

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT_PIN = llama_cpp_pin(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def test_the_package_reads_the_pin() -> None:
    assert LLAMA_CPP_VERSION == PYPROJECT_PIN


def test_the_scripts_read_the_pin() -> None:
    for script in ("install.sh", "gpu-bench.sh"):
        text = (ROOT / "scripts" / script).read_text()
        (line,) = re.findall(r"^LLAMA_CPP_VERSION=\$\(.*\)", text, re.M)
        line = line.replace('"$repo/pyproject.toml"', "pyproject.toml")
        out = subprocess.run(["bash", "-c", f"{line}; echo $LLAMA_CPP_VERSION"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        assert out == PYPROJECT_PIN, script


def code(path: Path) -> str:
    """The file without its comments (a comment may quote a version as an example)."""
    return "\n".join(line.split("#")[0] for line in path.read_text(errors="replace").splitlines())


def test_no_other_file_writes_the_version() -> None:
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "scripts").glob("*")]
    assert [f.name for f in files if PYPROJECT_PIN in code(f)] == []
