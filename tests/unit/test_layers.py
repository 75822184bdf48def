"""The package's layers, as docs/structure.md draws them: api -> fleet -> engine, each importing only downward.

Checked two ways: statically (every ``import`` statement of every module, read with ``ast``) and for real (a fresh
interpreter imports a module and reports what else got loaded).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "llamafleet"
HTTP_FRAMEWORKS = ("fastapi", "starlette", "uvicorn")


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, at any depth of the file (lazy imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).glob("*.py"))


def _loaded_after_import(module: str) -> list[str]:
    code = f"import sys, json; import {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return list(json.loads(done.stdout))


@pytest.mark.parametrize("path", _modules("engine"), ids=lambda p: p.name)
def test_the_engine_imports_nothing_of_llamafleet_outside_itself(path: Path) -> None:
    outside = {n for n in _imports(path) if n.startswith("llamafleet.") and not n.startswith("llamafleet.engine")}
    assert not outside, f"engine/{path.name} imports {sorted(outside)}"


@pytest.mark.parametrize("path", _modules("engine"), ids=lambda p: p.name)
def test_the_engine_imports_no_asyncio_sockets_or_http(path: Path) -> None:
    banned = {n for n in _imports(path) if n.split(".")[0] in ("asyncio", "socket", "httpx", *HTTP_FRAMEWORKS)}
    assert not banned, f"engine/{path.name} imports {sorted(banned)}"


def test_every_native_call_is_in_the_engines_llama_bindings() -> None:
    """ctypes and llama-cpp-python's bindings are imported by the engine/llama*.py binding modules alone: the one
    place to audit what llamafleet asks of llama.cpp (and what can crash the process)."""
    native = {str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
              if {n.split(".")[0] for n in _imports(path)} & {"ctypes", "llama_cpp"}}
    assert native == {"engine/llama.py", "engine/llama_backend.py", "engine/llama_sampler.py"}


@pytest.mark.parametrize("folder", ["fleet", "engine", "placement", "model", "consistency", "envcheck", "bench"])
def test_only_the_api_package_imports_an_http_framework(folder: str) -> None:
    for path in _modules(folder):
        found = {n for n in _imports(path) if n.split(".")[0] in HTTP_FRAMEWORKS}
        assert not found, f"{folder}/{path.name} imports {sorted(found)}"


@pytest.mark.parametrize("folder", ["fleet", "engine", "placement", "model"])
def test_lower_layers_never_import_the_api(folder: str) -> None:
    for path in _modules(folder):
        up = {n for n in _imports(path) if n.startswith("llamafleet.api")}
        assert not up, f"{folder}/{path.name} imports {sorted(up)}"


def test_the_fleet_runs_without_loading_an_http_framework() -> None:
    loaded = _loaded_after_import("llamafleet.fleet.dispatch")
    assert not [m for m in loaded if m.split(".")[0] in HTTP_FRAMEWORKS]


@pytest.mark.parametrize("module", ["llamafleet.engine.scheduler", "llamafleet.engine.sequence",
                                    "llamafleet.engine.prefix", "llamafleet.engine.text", "llamafleet.engine.types"])
def test_the_engine_logic_imports_without_loading_llama_cpp(module: str) -> None:
    loaded = _loaded_after_import(module)
    assert "llama_cpp" not in loaded and "llamafleet.engine.llama" not in loaded


def test_every_subpackage_init_is_a_docstring_only() -> None:
    """A spawned worker imports ``llamafleet.fleet`` first; an import in an ``__init__`` would run in every worker
    before its GPU environment is set."""
    for init in PACKAGE.glob("*/__init__.py"):
        if init.parent.name == "engine":
            continue  # re-exports the engine's plain types (engine/types.py loads nothing)
        body = ast.parse(init.read_text(encoding="utf-8")).body
        assert all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body), init


def test_the_api_converts_a_json_schema_without_loading_llama_cpp() -> None:
    """The API process turns response_format schemas into grammars; it must not load libllama (and with it the CUDA
    backend) to do so: it never loads a model."""
    code = ("import sys, json; from llamafleet.engine.grammar import json_schema_grammar; "
            "json_schema_grammar({'type': 'object', 'properties': {'a': {'type': 'integer'}}}); "
            "print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert not [m for m in json.loads(done.stdout) if m.split(".")[0] == "llama_cpp"]
