"""Read the facts ``llamafleet check-env`` judges from the real machine (the only part of check-env that does I/O).

Nothing here raises for a broken machine: what cannot be read becomes ``None`` or empty, and the checks explain it.
llama.cpp is loaded in a child process (:func:`run_probe`), so a build that dies with SIGILL or hangs in CUDA
initialisation is reported instead of taking check-env down with it. Which CUDA runtime llama.cpp was built with is
read from the ELF headers of ``llama_cpp/lib/*.so`` (their ``DT_NEEDED`` entries, e.g. ``libcudart.so.12``), and
refined by the exact ``libcudart`` file the child process mapped.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import mmap
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from llamafleet.config import load_config
from llamafleet.envcheck.facts import (
    LLAMA_PACKAGE,
    DeviceFacts,
    DriverFacts,
    Facts,
    HostFacts,
    LlamaBuild,
    ModelFacts,
    PackageFact,
    PythonFacts,
)
from llamafleet.model.demo import demo_model_file
from llamafleet.paths import cache_dir
from llamafleet.placement.gpus import detect_inventory

PROBE_MARK = "llamafleet-envcheck-probe:"
PROBE_TIMEOUT_S = 180  # CUDA initialisation on many GPUs can take a while
SMI_TIMEOUT_S = 30
_SHT_DYNAMIC, _DT_NEEDED = 6, 1


def gather(model: str | None = None, config_path: str | None = None) -> Facts:
    """Facts about this machine; the model is ``model``, else the config's ``model_path``, else the demo model.

    Raises :class:`llamafleet.config.ConfigError` for an unreadable ``config_path`` (a user error, not a finding).
    """
    path, source = resolve_model(model, config_path)
    cfg = load_config(config_path) if config_path else None
    tier = (cfg.cache_ram_mib or 0) * (cfg.replicas or 1) << 20 if cfg is not None and cfg.prefix_cache else 0
    return Facts(
        inventory=detect_inventory(),
        driver=_driver(),
        devices=_devices(),
        llama=_llama(),
        python=_python(),
        host=_host(),
        model=replace(model_facts(path, source), kv_tier_bytes=tier),
    )


def resolve_model(model: str | None, config_path: str | None) -> tuple[str | None, str]:
    """The model file to measure against and where it came from; ``(None, "none")`` when there is none yet."""
    if model:
        return model, "--model"
    if config_path:
        cfg = load_config(config_path)
        if cfg.model_path:
            return cfg.model_path, f"config {Path(config_path).name}"
    demo = demo_model_file()
    return (str(demo), "demo model") if demo.exists() else (None, "none")


def elf_needed(path: Path) -> tuple[str, ...]:
    """The shared libraries an ELF file links (its ``DT_NEEDED`` entries); ``()`` when it is not a readable ELF."""
    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _needed(data)
    except (OSError, ValueError, struct.error, IndexError):
        return ()


def _needed(data: mmap.mmap) -> tuple[str, ...]:
    if data[:4] != b"\x7fELF":
        return ()
    is64, order = data[4] == 2, "<" if data[5] == 1 else ">"
    if is64:
        (shoff,) = struct.unpack_from(order + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
        section, entry = order + "IIQQQQIIQQ", order + "qQ"
    else:
        (shoff,) = struct.unpack_from(order + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x2E)
        section, entry = order + "IIIIIIIIII", order + "iI"
    # Section header fields: name, type, flags, addr, offset, size, link, info, addralign, entsize.
    headers = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    for sh in headers:
        if sh[1] != _SHT_DYNAMIC:
            continue
        strtab = headers[sh[6]][4]
        names = []
        for off in range(sh[4], sh[4] + sh[5], struct.calcsize(entry)):
            tag, value = struct.unpack_from(entry, data, off)
            if tag == 0:
                break
            if tag == _DT_NEEDED:
                start = strtab + value
                names.append(data[start : data.find(b"\0", start)].decode(errors="replace"))
        return tuple(names)
    return ()


def _first_line(path: str) -> str | None:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    return lines[0].strip() if lines else None


def _driver() -> DriverFacts:
    smi = shutil.which("nvidia-smi")
    module = _first_line("/proc/driver/nvidia/version")
    if smi is None:
        return DriverFacts(nvidia_smi=False, kernel_module=module)
    try:
        proc = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return DriverFacts(nvidia_smi=True, smi_error=f"nvidia-smi did not answer: {e}", kernel_module=module)
    said = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    if proc.returncode != 0:
        if any("not a valid field" in line for line in said):  # drivers before 510 cannot report compute_cap
            return DriverFacts(nvidia_smi=True, kernel_module=module)
        error = said[0] if said else f"nvidia-smi exited with {proc.returncode}"
        return DriverFacts(nvidia_smi=True, smi_error=error, kernel_module=module)
    return DriverFacts(nvidia_smi=True, kernel_module=module, compute_caps=tuple(said))


def _devices() -> DeviceFacts:
    nodes = [p for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)]
    files = tuple(str(p) for p in sorted(nodes, key=lambda p: int(p.name[6:])))
    in_container = (
        Path("/.dockerenv").exists()
        or Path("/run/.containerenv").exists()
        or "container" in os.environ
        or "KUBERNETES_SERVICE_HOST" in os.environ
    )
    return DeviceFacts(
        files=files,
        unusable=tuple(f for f in files if not os.access(f, os.R_OK | os.W_OK)),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        nvidia_visible_devices=os.environ.get("NVIDIA_VISIBLE_DEVICES"),
        in_container=in_container,
    )


def _dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _llama() -> LlamaBuild:
    try:
        spec = importlib.util.find_spec("llama_cpp")  # finds the package without importing it
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return LlamaBuild(found=False)
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    libs = sorted(p for p in lib.glob("*.so*") if p.is_file()) if lib.is_dir() else []
    needed = sorted({name for p in libs for name in elf_needed(p)})
    base = LlamaBuild(
        found=True,
        version=_dist_version("llama-cpp-python"),
        lib_names=tuple(p.name for p in libs),
        needed=tuple(needed),
    )
    return _probe(base)


def run_probe() -> None:
    """Child-process entry: load llama.cpp through the engine's bindings and print one marked JSON line about it."""
    out: dict[str, object] = {}
    try:
        from llamafleet.engine import llama_backend

        out["offload"] = bool(llama_backend.supports_gpu_offload())
        out["system_info"] = llama_backend.system_info()
    except Exception as e:  # ImportError, or OSError for a shared library that cannot load: all reported
        out["error"] = f"{type(e).__name__}: {e}"
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    cudart = re.findall(r"/(libcudart\.so[.\d]*)\s*$", maps, re.M)
    out["cudart_file"] = cudart[0] if cudart else None
    print(PROBE_MARK + json.dumps(out), flush=True)


def _probe(base: LlamaBuild) -> LlamaBuild:
    cmd = [sys.executable, "-c", "from llamafleet.envcheck.gather import run_probe; run_probe()"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return replace(base, load_error=f"loading llama.cpp took longer than {PROBE_TIMEOUT_S} s")
    if proc.returncode < 0:
        sig = -proc.returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return replace(base, load_signal=sig, load_error=f"the loading process was killed by {name}")
    found = [line[len(PROBE_MARK) :] for line in proc.stdout.splitlines() if line.startswith(PROBE_MARK)]
    if not found:
        said = [line for line in proc.stderr.splitlines() if line.strip()]
        return replace(base, load_error=f"exited with {proc.returncode}: {said[-1] if said else 'no output'}")
    data = json.loads(found[-1])
    cudart = data.get("cudart_file")
    if "error" in data:
        return replace(base, load_error=str(data["error"]), cudart_file=cudart)
    return replace(
        base,
        loaded=True,
        offload=bool(data["offload"]),
        system_info=str(data["system_info"]),
        cudart_file=cudart,
    )


def _requirements(dist: str) -> list[PackageFact]:
    """``dist``'s declared requirements, without extras, each with the installed version."""
    try:
        declared = md.requires(dist) or []
    except md.PackageNotFoundError:
        return []
    out = []
    for text in declared:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # extras (dev tools, llama-cpp-python's own server) are not needed to serve
        out.append(PackageFact(req.name, str(req.specifier), _dist_version(req.name), dist))
    return out


def _python() -> PythonFacts:
    """llamafleet's requirements, plus llama-cpp-python's own: scripts/install.sh installs that wheel --no-deps."""
    version = platform.python_version()
    try:
        requires_python = md.metadata("llamafleet")["Requires-Python"]
    except md.PackageNotFoundError:
        return PythonFacts(version=version, requires=None)
    packages = _requirements("llamafleet")
    known = {p.name.lower() for p in packages}
    packages += [p for p in _requirements(LLAMA_PACKAGE) if p.name.lower() not in known]
    return PythonFacts(version=version, requires=requires_python, packages=tuple(packages))


def _host() -> HostFacts:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    m = re.search(r"^flags\s*:(.*)$", cpuinfo, re.M)
    mem: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if rest.strip().endswith(" kB"):
                mem[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        mem = {}
    return HostFacts(
        machine=platform.machine(),
        cpu_flags=frozenset(m.group(1).split()) if m else None,
        mem_total=mem.get("MemTotal"),
        mem_available=mem.get("MemAvailable"),
    )


def model_facts(path: str | None, source: str) -> ModelFacts:
    """The model file's size and magic, and the free space of the llamafleet cache."""
    cache = cache_dir()
    try:
        free: int | None = shutil.disk_usage(cache).free
    except OSError:
        free = None
    size, magic = None, b""
    if path is not None:
        try:
            p = Path(path).expanduser()
            with p.open("rb") as fh:
                magic = fh.read(4)
            size = p.stat().st_size
        except OSError:
            size = None
    return ModelFacts(
        path=path,
        source=source,
        size_bytes=size,
        is_gguf=magic == b"GGUF",
        cache_dir=str(cache),
        cache_free=free,
    )
