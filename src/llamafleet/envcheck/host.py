"""The host half of ``llamafleet check-env``: Python and packages, llama.cpp loading, CPU features, model, RAM, disk.

Pure functions of :class:`~llamafleet.envcheck.facts.Facts`, each returning one
:class:`~llamafleet.envcheck.facts.CheckResult`.

The CPU check guards the SIGILL trap: llama.cpp compiled with ``-march=native`` uses every instruction the build
machine advertised (AVX-512, AMX). A virtual machine can advertise AMX in ``/proc/cpuinfo`` without granting it, and a
wheel built on one CPU can land on another; either way the process dies with SIGILL at the first such instruction.
The portable build (``scripts/install.sh``'s default) needs only SSE3, SSSE3, AVX, AVX2, BMI2, F16C and FMA.
"""

from __future__ import annotations

import re
import signal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from llamafleet.envcheck.facts import LLAMA_PACKAGE, CheckResult, Facts, Finding, combine, size_text

INSTALL = "run scripts/install.sh (LLAMAFLEET_BACKEND=cuda on a GPU machine)"
REBUILD_PORTABLE = "rebuild llama.cpp portable: scripts/install.sh (LLAMAFLEET_BACKEND=cpu, or cuda; never native)"

# llama.cpp's CPU feature names (llama_print_system_info) -> the /proc/cpuinfo flag a CPU needs to run them.
CPU_FLAG = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX2": "avx2",
    "BMI2": "bmi2",
    "F16C": "f16c",
    "FMA": "fma",
    "AVX_VNNI": "avx_vnni",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}
PORTABLE = frozenset({"SSE3", "SSSE3", "AVX", "AVX2", "BMI2", "F16C", "FMA"})
AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16"})
MIN_CACHE_FREE = 2**30 * 2  # fetched models, built wheels (a CUDA wheel is large), logs
CRITICAL_CACHE_FREE = 2**20 * 256


def _satisfies(version: str, spec: str) -> bool:
    try:
        return Version(version) in SpecifierSet(spec)
    except (InvalidVersion, InvalidSpecifier):
        return False


def check_python(f: Facts) -> CheckResult:
    """The interpreter against llamafleet's Requires-Python."""
    py = f.python
    if py.requires is None:
        text = f"Python {py.version}; llamafleet is not installed here, so its needs are unknown"
        return CheckResult("python", "warn", text, INSTALL)
    if _satisfies(py.version, py.requires):
        return CheckResult("python", "pass", f"Python {py.version} (llamafleet needs {py.requires})")
    return CheckResult(
        "python",
        "fail",
        f"Python {py.version}, but llamafleet needs {py.requires}",
        "recreate the environment with a newer interpreter: PYTHON=python3.11 scripts/install.sh",
    )


def check_packages(f: Facts) -> CheckResult:
    """Every declared requirement installed in a version it allows; llama-cpp-python exactly at its pin."""
    pkgs = f.python.packages
    if f.python.requires is None:
        return CheckResult("packages", "skip", "llamafleet is not installed (see python)")
    summary = ", ".join(f"{p.name} {p.installed}" for p in pkgs if p.installed)
    findings = []
    missing = [p for p in pkgs if p.installed is None]
    if missing:
        names = ", ".join(f"{p.name} (for {p.required_by})" for p in missing)
        fix = INSTALL  # never a bare pip install of llama-cpp-python: pip's default build is -march=native
        if all(p.name != LLAMA_PACKAGE for p in missing):
            fix = f"pip install {' '.join(p.name for p in missing)}, or {INSTALL}"
        findings.append(Finding("fail", f"not installed: {names}", fix))
    for p in pkgs:
        if p.installed is None or _satisfies(p.installed, p.spec):
            continue
        if p.name == LLAMA_PACKAGE:
            text = f"{p.name} {p.installed}, but llamafleet is pinned to {p.spec} (binding names drift by version)"
            findings.append(Finding("fail", text, INSTALL))
        else:
            findings.append(Finding("warn", f"{p.name} {p.installed} does not satisfy {p.spec}", INSTALL))
    return combine("packages", summary, findings)


def check_llama(f: Facts) -> CheckResult:
    """Does llama.cpp load, and what was it built with?"""
    ll = f.llama
    if not ll.found:
        return CheckResult("llama.cpp", "fail", "llama-cpp-python is not installed", INSTALL)
    if ll.load_signal == signal.SIGILL:
        return CheckResult(
            "llama.cpp",
            "fail",
            "llama.cpp died with SIGILL while loading: it was compiled for CPU instructions this machine does not "
            "execute (a -march=native build from another CPU, or AMX advertised but not granted by the hypervisor)",
            REBUILD_PORTABLE,
        )
    if not ll.loaded:
        fix = INSTALL
        error = ll.load_error or ""
        module = re.match(r"ModuleNotFoundError: No module named '([\w.]+)'", error)
        if module:
            fix = f"install the missing Python module: pip install {module.group(1).split('.')[0]}"
        elif "libcu" in error:
            fix = "install the CUDA runtime libraries llama.cpp was built with, or add their folder to LD_LIBRARY_PATH"
        return CheckResult("llama.cpp", "fail", f"llama.cpp does not load: {ll.load_error}", fix)
    backends = ", ".join(["cpu", *ll.backends])
    version = ll.version or "(version unknown)"
    return CheckResult("llama.cpp", "pass", f"llama-cpp-python {version}, backends {backends}")


def check_cpu(f: Facts) -> CheckResult:
    """CPU features against what the build uses and what the portable build needs; the AMX/SIGILL trap."""
    flags = f.host.cpu_flags
    if flags is None:
        return CheckResult("cpu", "skip", f"CPU flags unknown on {f.host.machine} (checked on x86-64 Linux only)")
    compiled = f.llama.cpu_features
    isa = None if compiled is None else frozenset(compiled & CPU_FLAG.keys())
    findings = []
    if isa is not None:
        summary = f"build uses {', '.join(sorted(isa)) or 'no SIMD extensions'}; the CPU has them all"
        lacking = sorted(x for x in isa if CPU_FLAG[x] not in flags)
        if lacking:
            summary = f"build uses {', '.join(sorted(isa))}"
            findings.append(
                Finding(
                    "fail",
                    f"llama.cpp uses {', '.join(lacking)}, which this CPU does not advertise: SIGILL",
                    REBUILD_PORTABLE,
                )
            )
    else:
        summary = "the installed build is unknown (llama.cpp did not load)"
        lacking = sorted(x for x in PORTABLE if CPU_FLAG[x] not in flags)
        if lacking:
            findings.append(
                Finding(
                    "warn",
                    f"this CPU lacks {', '.join(lacking)}, needed by the portable build",
                    "build for this CPU instead: LLAMAFLEET_BACKEND=native scripts/install.sh",
                )
            )
        else:
            summary += "; the CPU has everything the portable build needs"
    amx = sorted(flags & AMX_FLAGS)
    if amx and (isa is None or not isa <= PORTABLE):
        if isa is None:
            build = "is not known to be the portable one (llama.cpp did not load)"
        else:
            build = f"uses {', '.join(sorted(isa - PORTABLE))} beyond the portable set"
        findings.append(
            Finding(
                "warn",
                f"the CPU advertises {', '.join(amx)} and the llama.cpp build {build}: a -march=native build dies "
                "with SIGILL where the hypervisor does not grant AMX",
                REBUILD_PORTABLE,
            )
        )
    elif amx:
        summary += f"; AMX advertised ({', '.join(amx)}) but the portable build does not use it"
    return combine("cpu", summary, findings)


def check_model(f: Facts) -> CheckResult:
    """The model check-env measures against: given, found, and a GGUF file."""
    m = f.model
    if m.path is None:
        return CheckResult(
            "model",
            "skip",
            "no model given (--model FILE or --config fleet.yaml) and the demo model is not fetched yet",
        )
    if m.size_bytes is None:
        return CheckResult(
            "model",
            "fail",
            f"model file not found: {m.path} (from {m.source})",
            "correct the path, or use the demo model: llamafleet model fetch",
        )
    if not m.is_gguf:
        return CheckResult(
            "model",
            "fail",
            f"{m.path} is not a GGUF file (it does not start with 'GGUF'; a Git LFS pointer or an HTML page?)",
            "download the real .gguf file",
        )
    return CheckResult("model", "pass", f"{m.path}: {size_text(m.size_bytes)} (from {m.source})")


def check_ram(f: Facts) -> CheckResult:
    """Available RAM against the model: all of it on the CPU, a pass through the page cache on GPUs."""
    h, size, tier = f.host, f.model.size_bytes, f.model.kv_tier_bytes
    if h.mem_available is None or h.mem_total is None:
        return CheckResult("ram", "skip", "memory unknown (no /proc/meminfo)")
    summary = f"{size_text(h.mem_available)} of {size_text(h.mem_total)} RAM available"
    if tier and h.mem_available < tier + (size or 0):
        text = f"the KV cache's RAM tier (cache_ram_mib, {size_text(tier)} for all replicas) and the model do not fit"
        return combine("ram", summary, [Finding("fail", text, "lower cache_ram_mib, or leave it unset (sized from "
                                                "the RAM left)")])
    if size is None:
        return CheckResult("ram", "pass", f"{summary}; no model to compare")
    on_gpu = bool(f.inventory.gpus) and f.llama.offload is not False
    if on_gpu:
        if h.mem_available >= size:
            text = f"{summary}; the model ({size_text(size)}) loads through it onto the GPUs"
            return CheckResult("ram", "pass", text)
        finding = Finding(
            "warn",
            f"less than the model's {size_text(size)}: loading onto the GPUs re-reads it from disk (slow start)",
            "free memory (other processes, page cache pinned by tmpfs)",
        )
        return combine("ram", summary, [finding])
    if h.mem_available >= size * 1.2:
        return CheckResult("ram", "pass", f"{summary}; the model ({size_text(size)}) runs on the CPU from RAM")
    fix = "free memory, use a smaller quantization, or serve on GPUs"
    if h.mem_available < size:
        text = f"CPU inference needs the whole model ({size_text(size)}) in RAM"
        return combine("ram", summary, [Finding("fail", text, fix)])
    text = f"the model ({size_text(size)}) fits, but with little room for the KV cache and buffers"
    return combine("ram", summary, [Finding("warn", text, fix)])


def check_disk(f: Facts) -> CheckResult:
    """Free space where llamafleet writes (fetched and synthetic models, built wheels)."""
    m = f.model
    if m.cache_free is None:
        return CheckResult("disk", "skip", f"cannot measure free space for {m.cache_dir}")
    need = max(MIN_CACHE_FREE, m.size_bytes or 0)
    summary = f"{size_text(m.cache_free)} free for the llamafleet cache ({m.cache_dir})"
    fix = "free space, or point LLAMAFLEET_CACHE at a larger disk"
    if m.cache_free < CRITICAL_CACHE_FREE:
        return combine("disk", summary, [Finding("fail", "too little to fetch even the demo model", fix)])
    if m.cache_free < need:
        text = f"under {size_text(need)}, the room for a model this size, a built wheel and logs"
        return combine("disk", summary, [Finding("warn", text, fix)])
    return CheckResult("disk", "pass", summary)
