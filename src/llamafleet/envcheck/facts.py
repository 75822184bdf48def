"""The facts ``llamafleet check-env`` judges, and the verdict of one check: plain frozen data, no I/O.

:func:`llamafleet.envcheck.gather.gather` fills :class:`Facts` from the real machine. Tests build them by hand (the
GPU part with :func:`llamafleet.placement.gpus.load_inventory`) to describe machines we do not have: a GPU server with a
CPU-only wheel, a container started without ``--gpus all``, a driver older than the CUDA llama.cpp was built with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from llamafleet.placement.gpus import Inventory

Status = Literal["pass", "warn", "fail", "skip"]
LLAMA_PACKAGE = "llama-cpp-python"  # the one requirement pinned exactly: binding names drift between versions
SEVERITY: dict[Status, int] = {"skip": 0, "pass": 0, "warn": 1, "fail": 2}  # also the exit code's ladder


@dataclass(frozen=True)
class CheckResult:
    """One line of the report: what was checked, the verdict, what was found and how to fix it."""

    name: str
    status: Status
    detail: str
    fix: str | None = None


@dataclass(frozen=True)
class Finding:
    """A problem one check found; :func:`combine` folds a check's findings into its :class:`CheckResult`."""

    status: Literal["warn", "fail"]
    text: str
    fix: str | None = None


def combine(name: str, summary: str, findings: list[Finding]) -> CheckResult:
    """One result from a summary and the problems found: the worst status wins; texts and fixes are joined."""
    if not findings:
        return CheckResult(name, "pass", summary)
    status: Status = "fail" if any(f.status == "fail" for f in findings) else "warn"
    detail = "; ".join([summary, *(f.text for f in findings)] if summary else [f.text for f in findings])
    fixes = list(dict.fromkeys(f.fix for f in findings if f.fix))
    return CheckResult(name, status, detail, "; ".join(fixes) or None)


@dataclass(frozen=True)
class DriverFacts:
    """The NVIDIA driver as the shell sees it (the GPUs themselves come from the NVML inventory)."""

    nvidia_smi: bool  # nvidia-smi is on PATH
    smi_error: str | None = None  # what nvidia-smi printed when it failed
    kernel_module: str | None = None  # first line of /proc/driver/nvidia/version; None: module not loaded
    compute_caps: tuple[str, ...] = ()  # per GPU, e.g. "9.0" (nvidia-smi --query-gpu=compute_cap)


@dataclass(frozen=True)
class DeviceFacts:
    """The GPU device files and the variables that decide which GPUs CUDA shows this process."""

    files: tuple[str, ...] = ()  # /dev/nvidia0, /dev/nvidia1, ... (one per GPU; not nvidiactl/uvm)
    unusable: tuple[str, ...] = ()  # those this process may not open for reading and writing
    cuda_visible_devices: str | None = None
    nvidia_visible_devices: str | None = None  # set by the NVIDIA container runtime
    in_container: bool = False


@dataclass(frozen=True)
class LlamaBuild:
    """The installed llama-cpp-python: its files, the libraries they link, and what llama.cpp said when loaded."""

    found: bool  # the package's files are installed
    version: str | None = None
    lib_names: tuple[str, ...] = ()  # file names in llama_cpp/lib
    needed: tuple[str, ...] = ()  # shared libraries those files link (ELF DT_NEEDED), e.g. libcudart.so.12
    loaded: bool = False  # a child process imported it and asked llama.cpp for its system info
    load_error: str | None = None  # why loading failed (exception text, signal, timeout)
    load_signal: int | None = None  # the signal that killed the loading process (4 = SIGILL)
    offload: bool | None = None  # engine.llama_backend.supports_gpu_offload(): a GPU of this host, not RPC
    system_info: str = ""  # llama_print_system_info(): "CPU : SSE3 = 1 | ... | CUDA : ARCHS = 900 | ..."
    cudart_file: str | None = None  # the libcudart file the loading process mapped, e.g. libcudart.so.12.4.127

    def sections(self) -> dict[str, dict[str, str]]:
        """The system info parsed per backend: ``{"CPU": {"AVX2": "1", ...}, "CUDA": {"ARCHS": "900", ...}}``."""
        out: dict[str, dict[str, str]] = {}
        current: dict[str, str] | None = None
        for piece in self.system_info.split("|"):
            piece = piece.strip()
            if " : " in piece:
                backend, piece = piece.split(" : ", 1)
                current = out.setdefault(backend.strip(), {})
            if current is not None and " = " in piece:
                key, value = piece.split(" = ", 1)
                current[key.strip()] = value.strip()
        return out

    @property
    def cpu_features(self) -> frozenset[str] | None:
        """Instruction-set features llama.cpp's CPU backend was compiled with; None when it did not load."""
        if not self.loaded:
            return None
        return frozenset(k for k, v in self.sections().get("CPU", {}).items() if v == "1")

    @property
    def backends(self) -> tuple[str, ...]:
        """GPU/accelerator backend libraries shipped with the build: ("cuda",), ("vulkan",), or () for CPU only (the
        RPC backend, which every build has, reaches other hosts' devices: not counted)."""
        found = set()
        for name in self.lib_names:
            m = re.match(r"libggml-([a-z]+)\.so", name)
            if m and m.group(1) not in ("base", "cpu", "rpc"):
                found.add(m.group(1))
        return tuple(sorted(found))

    @property
    def cuda_runtime(self) -> str | None:
        """The CUDA runtime llama.cpp was built with: "12.4" when the loaded file says so, else "12"; None: unknown."""
        if self.cudart_file:
            m = re.search(r"libcudart\.so\.(\d+)\.(\d+)", self.cudart_file)
            if m:
                return f"{m.group(1)}.{m.group(2)}"
        for name in self.needed:
            m = re.fullmatch(r"libcudart\.so\.(\d+)", name)
            if m:
                return m.group(1)
        return None

    @property
    def cuda_archs(self) -> tuple[tuple[int, int], ...]:
        """Compute capabilities the CUDA kernels were compiled for, e.g. ((9, 0),), from the system info."""
        raw = self.sections().get("CUDA", {}).get("ARCHS", "")
        return tuple((int(a) // 100, int(a) % 100 // 10) for a in re.findall(r"\d+", raw))


@dataclass(frozen=True)
class PackageFact:
    """One requirement and the installed version (None: not installed)."""

    name: str
    spec: str  # the version specifier, e.g. "==0.3.36" or ">=1.26"
    installed: str | None
    required_by: str = "llamafleet"


@dataclass(frozen=True)
class PythonFacts:
    """The interpreter and the packages llamafleet declares."""

    version: str
    requires: str | None  # llamafleet's Requires-Python, e.g. ">=3.11"; None when llamafleet is not installed
    packages: tuple[PackageFact, ...] = ()


@dataclass(frozen=True)
class HostFacts:
    """CPU and memory of the machine."""

    machine: str  # platform.machine(), e.g. x86_64
    cpu_flags: frozenset[str] | None  # /proc/cpuinfo "flags"; None when unknown (not x86 Linux)
    mem_total: int | None  # bytes
    mem_available: int | None  # bytes


@dataclass(frozen=True)
class ModelFacts:
    """The model check-env measures against, and the disk llamafleet writes to."""

    path: str | None  # None: no model given and the demo model is not fetched yet
    source: str  # "--model", "config <file>", "demo model" or "none"
    size_bytes: int | None  # None when the file does not exist
    is_gguf: bool  # the file starts with the GGUF magic
    cache_dir: str  # where llamafleet keeps fetched models, built wheels and synthetic models
    cache_free: int | None  # bytes free on the cache's file system
    kv_tier_bytes: int = 0  # the config's RAM tier of the KV cache, all replicas (cache_ram_mib x replicas)


@dataclass(frozen=True)
class Facts:
    """Everything the checks judge; see :func:`llamafleet.envcheck.run.run_checks`."""

    inventory: Inventory
    driver: DriverFacts
    devices: DeviceFacts
    llama: LlamaBuild
    python: PythonFacts
    host: HostFacts
    model: ModelFacts


def size_text(n_bytes: float) -> str:
    """A size for people: "3.8 GiB", or "98 MiB" below one GiB."""
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.0f} MiB"
