"""The package's layers, as docs/structure.md draws them: every import goes down, and no module imports itself
through others (no circle, not even one broken by a lazy import).

Checked two ways: statically (every ``import`` statement of every module, read with ``ast``: the import graph of the
whole package, root modules included) and for real (a fresh interpreter imports a module and reports what else got
loaded).
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

# Bottom first. A module imports only from its own package (or, for a root module, itself) and from lower layers:
# never sideways, never up. ("llamafleet" is the package's own __init__.)
LAYERS = (
    ("llamafleet", "paths", "rpc", "exits", "openai_wire"),
    ("engine", "model"),
    ("config_sections",),
    ("config",),
    ("placement",),
    ("fleet", "catalog", "flags"),
    ("tenants",),
    ("api", "bench", "envcheck"),
    ("consistency",),
    ("commands",),
    ("cli",),
)
RANK = {group: rank for rank, groups in enumerate(LAYERS) for group in groups}


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


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _graph() -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports. ``from a.b import c`` names the module
    ``a.b.c`` if there is one, else ``a.b``. Imports at any depth count: a lazy one, or one under TYPE_CHECKING, is
    still a dependency (moving an import into a function hides a circle, it does not remove it)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in MODULES)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                             for a in node.names)
        graph[name] = {m for m in found if m in MODULES and m != name}
    return graph


def _group(module: str) -> str:
    """The package a module belongs to ("fleet" for llamafleet.fleet.router), or the root module's own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_no_module_imports_itself_through_others() -> None:
    graph = _graph()
    reach = {m: _reachable(graph, m) for m in graph}
    circles = {tuple(sorted(n for n in reach[m] if m in reach[n])) for m in graph if m in reach[m]}
    assert not circles, f"import circles: {sorted(circles)}"


def test_every_import_goes_down_the_layers() -> None:
    assert {_group(m) for m in MODULES} == set(RANK), "a package or root module was added: give it a layer"
    upward = sorted(f"{m} imports {t}" for m, targets in _graph().items() for t in targets
                    if _group(m) != _group(t) and RANK[_group(t)] >= RANK[_group(m)])
    assert not upward, upward


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    """The two checks above read what they must: imports inside functions and under TYPE_CHECKING."""
    graph = _graph()
    assert "llamafleet.engine.llama_backend" in graph["llamafleet.commands.rpc_server"]  # inside run()
    assert "llamafleet.engine.llama_sampler" in graph["llamafleet.engine.sequence"]  # under TYPE_CHECKING
    assert "llamafleet.engine.llama_sampler" in graph["llamafleet.engine.llama"]  # from a import b, b a module


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
    assert native == {"engine/llama.py", "engine/llama_backend.py", "engine/llama_sampler.py", "engine/llama_lora.py",
                      "engine/llama_memory.py"}


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


@pytest.mark.parametrize("module", ["llamafleet.config", "llamafleet.envcheck.run"])
def test_the_configuration_loads_without_the_fleet_or_templates(module: str) -> None:
    """Every command reads the configuration; check-env must run where the fleet's dependencies do not."""
    loaded = _loaded_after_import(module)
    assert not [m for m in loaded if m.startswith("llamafleet.fleet") or m.split(".")[0] == "jinja2"]


def test_the_fleet_runs_without_loading_an_http_framework() -> None:
    loaded = _loaded_after_import("llamafleet.fleet.dispatch")
    assert not [m for m in loaded if m.split(".")[0] in HTTP_FRAMEWORKS]


@pytest.mark.parametrize("module", ["llamafleet.engine.scheduler", "llamafleet.engine.sequence",
                                    "llamafleet.engine.prefix", "llamafleet.engine.text", "llamafleet.engine.types",
                                    "llamafleet.engine.kv_cost"])
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
