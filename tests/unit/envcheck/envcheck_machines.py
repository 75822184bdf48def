"""Machines described for the check-env tests: a healthy 2xH200 server and the CPU/llama.cpp facts to vary.

The GPUs come from a real inventory file read by :func:`llamafleet.placement.gpus.load_inventory`; the rest are the
facts :func:`llamafleet.envcheck.gather.gather` would read on such a machine (system info strings as llama.cpp prints
them).
"""

from __future__ import annotations

from pathlib import Path

from llamafleet.envcheck.facts import (
    CheckResult,
    DeviceFacts,
    DriverFacts,
    Facts,
    HostFacts,
    LlamaBuild,
    ModelFacts,
    PackageFact,
    PythonFacts,
)
from llamafleet.placement.gpus import Inventory, load_inventory

GIB = 2**30

# A Sapphire Rapids-like CPU (AVX-512 and AMX) and a Zen 3-like one (AVX2, no AVX-512, no AMX).
ZEN3_FLAGS = frozenset({"fpu", "sse", "sse2", "pni", "ssse3", "sse4_1", "sse4_2", "fma", "f16c", "avx", "avx2", "bmi2"})
SPR_FLAGS = ZEN3_FLAGS | {"avx512f", "avx512vbmi", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"}
# llama_print_system_info() of scripts/install.sh's portable CUDA build (sm_90), and of a -march=native build.
PORTABLE_CPU = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | "
    "REPACK = 1 | "
)
NATIVE_CPU = PORTABLE_CPU + "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | "
CUDA_90 = "CUDA : ARCHS = 900 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | "
CUDA_LIBS = ("libggml-base.so", "libggml-cpu.so", "libggml-cuda.so", "libggml.so", "libllama.so")


def write_inventory(tmp_path: Path, text: str) -> Inventory:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return load_inventory(path)


H200X2 = """
gpus:
  - {name: NVIDIA H200, total_mib: 143771, free_mib: 143000, uuid: GPU-0a1b2c3d}
  - {name: NVIDIA H200, total_mib: 143771, free_mib: 143000, uuid: GPU-9f8e7d6c}
interconnect: nvlink
driver_version: "550.54.15"
cuda_driver_version: "12.4"
"""


def healthy(inv: Inventory) -> Facts:
    """A well set-up GPU server: CUDA 12 build with offload, devices usable, 4 GiB model, plenty of RAM and disk."""
    return Facts(
        inventory=inv,
        driver=DriverFacts(nvidia_smi=True, kernel_module="NVRM version: 550.54.15", compute_caps=("9.0",) * 2),
        devices=DeviceFacts(files=tuple(f"/dev/nvidia{g.index}" for g in inv.gpus)),
        llama=LlamaBuild(
            found=True,
            version="0.3.36",
            lib_names=CUDA_LIBS,
            needed=("libcublas.so.12", "libcuda.so.1", "libcudart.so.12", "libggml-base.so"),
            loaded=True,
            offload=True,
            system_info=PORTABLE_CPU + CUDA_90,
            cudart_file="libcudart.so.12.4.127",
        ),
        python=PythonFacts("3.11.7", ">=3.11", (PackageFact("llama-cpp-python", "==0.3.36", "0.3.36"),)),
        host=HostFacts("x86_64", SPR_FLAGS, mem_total=512 * GIB, mem_available=480 * GIB),
        model=ModelFacts("/models/7b.gguf", "--model", 4 * GIB, True, "/cache", 500 * GIB),
    )


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


def h200x2_facts(tmp_path: Path) -> Facts:
    """The healthy server with two NVLinked H200s."""
    return healthy(write_inventory(tmp_path, H200X2))
