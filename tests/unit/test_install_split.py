"""The quick start serves with what serving needs: ``scripts/install.sh`` installs no test tools and runs no apt, the
package imports nothing that only the extras bring, and the test command (``scripts/test.sh``) adds the extras and
says what it needs root for."""

from __future__ import annotations

import ast
import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the import names of the dev extras' packages (the distribution names differ for a few)
DEV_IMPORTS = {"pytest": "pytest", "pytest-timeout": "pytest_timeout", "pytest-xdist": "xdist", "openai": "openai",
               "anthropic": "anthropic",
               "websockets": "websockets", "mypy": "mypy", "ruff": "ruff", "types-PyYAML": None, "types-tqdm": None}


def _project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]  # type: ignore[no-any-return]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]


def test_the_runtime_dependencies_hold_no_test_tool() -> None:
    project = _project()
    runtime = {_name(r) for r in project["dependencies"]}  # type: ignore[attr-defined]
    dev = {_name(r) for r in project["optional-dependencies"]["dev"]}  # type: ignore[index]
    assert set(DEV_IMPORTS) == dev, "a dev extra was added or removed: name its import in DEV_IMPORTS"
    assert not runtime & dev


def test_the_package_never_imports_a_dev_extra() -> None:
    """Serving must work after a plain ``scripts/install.sh``: no module of the package needs a test tool."""
    dev_modules = {m for m in DEV_IMPORTS.values() if m}
    found = []
    for path in sorted((ROOT / "src" / "llamafleet").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                     else [])
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in dev_modules]
    assert not found


def _bash(script: str) -> str:
    """The script's text, checked to parse as bash."""
    path = ROOT / "scripts" / script
    subprocess.run(["bash", "-n", str(path)], check=True)
    return path.read_text(encoding="utf-8")


def test_install_installs_no_extra_and_runs_no_apt() -> None:
    text = _bash("install.sh")
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "apt-get" not in code and "sudo" not in code and "id -u" not in code
    assert 'EXTRAS=${LLAMAFLEET_EXTRAS:-}' in code  # none unless asked for
    assert '-e ".${EXTRAS:+[$EXTRAS]}"' in code
    # the torch extra off CUDA: PyTorch's CPU build first, never PyPI's default wheel with CUDA's gigabytes
    assert code.index('--index-url "$TORCH_INDEX" torch') < code.index('-e ".${EXTRAS:+[$EXTRAS]}"')


def test_the_test_command_adds_the_extras_and_says_what_needs_root() -> None:
    text = _bash("test.sh")
    assert "LLAMAFLEET_EXTRAS=${LLAMAFLEET_EXTRAS:-dev,ray,torch} bash scripts/install.sh" in text
    assert "apt-get install" in text and "needs root" in text
    assert "--durations=15" in text
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text(encoding="utf-8").replace("exec ", "")
