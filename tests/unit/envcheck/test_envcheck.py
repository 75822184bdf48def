"""``llamafleet check-env`` on this machine as it is (no GPU), the gathering step, and the host-side checks."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from envcheck_machines import (
    CUDA_90,
    GIB,
    H200X2,
    NATIVE_CPU,
    PORTABLE_CPU,
    SPR_FLAGS,
    ZEN3_FLAGS,
    by_name,
    h200x2_facts,
    healthy,
    write_inventory,
)

from llamafleet.cli import main
from llamafleet.config import ConfigError
from llamafleet.envcheck.facts import CheckResult, Facts, HostFacts, LlamaBuild, PackageFact, PythonFacts, Status
from llamafleet.envcheck.gather import elf_needed, gather, model_facts, resolve_model
from llamafleet.envcheck.run import exit_code, format_json, format_text, run_checks
from llamafleet.model.demo import default_model_path

REPO = Path(__file__).resolve().parents[3]
HAS_GPU = Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None


@pytest.fixture
def h200x2(tmp_path: Path) -> Facts:
    return h200x2_facts(tmp_path)


# --- this machine ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(HAS_GPU, reason="this test describes a machine without NVIDIA GPU")
def test_this_machine_reports_no_gpu_and_the_documented_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    model = str(default_model_path(progress=False))
    rc = main(["check-env", "--json", "--model", model])
    doc = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["driver"]["status"] == "warn"
    assert checks["driver"]["detail"].startswith("no NVIDIA GPU")
    assert "--cpu-only" in checks["driver"]["fix"]
    for name in ("gpus", "devices", "cuda", "interconnect"):
        assert checks[name]["status"] == "skip", checks[name]
    assert checks["model"]["status"] == "pass" and model in checks["model"]["detail"]
    statuses = {c["status"] for c in doc["checks"]}
    assert rc == doc["exit_code"] == (2 if "fail" in statuses else 1)  # the no-GPU warning makes it at least 1

    rc_cpu = main(["check-env", "--cpu-only", "--model", model])
    text = capsys.readouterr().out
    assert "PASS  driver" in text and "as intended" in text
    others = {c["status"] for c in doc["checks"] if c["name"] != "driver"}
    assert rc_cpu == (2 if "fail" in others else 1 if "warn" in others else 0)
    assert text.splitlines()[-1].endswith(f"exit code {rc_cpu}")


@pytest.mark.skipif(HAS_GPU, reason="this test describes a machine without NVIDIA GPU")
def test_shell_entry_runs_without_python_deps(tmp_path: Path) -> None:
    """Before the install (no .venv, no llamafleet on PATH): the shell's own checks, and a note to install."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "check_env.sh", tmp_path / "scripts")
    proc = subprocess.run(["bash", "scripts/check_env.sh", "--cpu-only"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("PASS  driver") and "no NVIDIA GPU" in lines[0]
    assert any(line.startswith("PASS  cpu") for line in lines)
    assert lines[-1].startswith("SKIP  llamafleet") and "scripts/install.sh" in lines[-1]
    assert proc.returncode == (2 if any(x.startswith("FAIL") for x in lines) else 1 if any(
        x.startswith("WARN") for x in lines) else 0)


@pytest.mark.skipif(HAS_GPU, reason="this test describes a machine without NVIDIA GPU")
def test_shell_entry_once_installed_says_each_check_once() -> None:
    proc = subprocess.run(["bash", "scripts/check_env.sh"], cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    assert lines[0] == "== llamafleet check-env"
    names = [line[6:].split()[0] for line in lines[1:] if line[:4] in ("PASS", "WARN", "FAIL", "SKIP")]
    assert names.count("driver") == 1 and len(names) == len(set(names)), names
    assert lines[-1].endswith(f"exit code {proc.returncode}")


def test_gathered_llama_build_matches_the_real_library() -> None:
    """The real installed llama.cpp: loaded in a child process, CPU build here, its features on this CPU."""
    pytest.importorskip("llama_cpp")
    facts = gather(model=str(default_model_path(progress=False)))
    ll = facts.llama
    assert ll.found and ll.loaded, ll.load_error
    assert ll.version == "0.3.36"
    assert "libllama.so" in ll.lib_names
    features = ll.cpu_features
    assert features is not None and "AVX2" in features
    results = by_name(run_checks(facts))
    assert results["llama.cpp"].status == "pass"
    assert results["cpu"].status == "pass", results["cpu"]
    if not HAS_GPU:
        assert ll.offload is ("cuda" in ll.backends)
        assert results["offload"].status == "pass"


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf cross-checks the ELF reader")
def test_elf_needed_agrees_with_readelf() -> None:
    import _ctypes

    libs = [Path(_ctypes.__file__)]
    spec_dir = Path(sys.prefix) / "lib"
    libs += sorted(spec_dir.glob("python3*/site-packages/llama_cpp/lib/*.so"))
    for lib in libs:
        out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
        expected = tuple(line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line)
        assert elf_needed(lib) == expected, lib
    assert elf_needed(REPO / "pyproject.toml") == ()


# --- host-side checks on described machines ------------------------------------------------------------


def test_cpu_features_and_the_amx_trap(h200x2: Facts) -> None:
    def cpu(flags: frozenset[str], info: str | None) -> CheckResult:
        ll = (
            replace(h200x2.llama, loaded=False, system_info="")
            if info is None
            else replace(h200x2.llama, system_info=info + CUDA_90)
        )
        return by_name(run_checks(replace(h200x2, llama=ll, host=replace(h200x2.host, cpu_flags=flags))))["cpu"]

    trap = cpu(SPR_FLAGS, NATIVE_CPU)
    assert trap.status == "warn" and "SIGILL" in trap.detail and "AMX_INT8" in trap.detail
    assert cpu(SPR_FLAGS, PORTABLE_CPU).status == "pass"
    assert cpu(SPR_FLAGS, None).status == "warn"  # AMX host, build unknown: warn before anyone builds natively
    moved = cpu(ZEN3_FLAGS, NATIVE_CPU)  # a native wheel from an AVX-512 machine copied to a Zen 3
    assert moved.status == "fail" and "AVX512" in moved.detail
    old = cpu(ZEN3_FLAGS - {"avx2", "fma"}, None)
    assert old.status == "warn" and "AVX2, FMA" in old.detail
    arm = replace(h200x2, host=HostFacts("aarch64", None, GIB, GIB))
    assert by_name(run_checks(arm))["cpu"].status == "skip"


def test_llama_load_failures(h200x2: Facts) -> None:
    crashed = replace(h200x2.llama, loaded=False, load_signal=int(signal.SIGILL), load_error="killed by SIGILL")
    r = by_name(run_checks(replace(h200x2, llama=crashed)))
    assert r["llama.cpp"].status == "fail" and "SIGILL" in r["llama.cpp"].detail
    assert r["llama.cpp"].fix and "portable" in r["llama.cpp"].fix
    assert r["offload"].status == "skip"
    no_cudart = replace(crashed, load_signal=None, load_error="OSError: libcudart.so.12: cannot open shared object")
    assert "LD_LIBRARY_PATH" in (by_name(run_checks(replace(h200x2, llama=no_cudart)))["llama.cpp"].fix or "")
    no_module = replace(no_cudart, load_error="ModuleNotFoundError: No module named 'diskcache'")
    assert by_name(run_checks(replace(h200x2, llama=no_module)))["llama.cpp"].fix == (
        "install the missing Python module: pip install diskcache"
    )
    missing = replace(h200x2, llama=LlamaBuild(found=False))
    assert by_name(run_checks(missing))["llama.cpp"].status == "fail"


def test_python_and_packages(h200x2: Facts) -> None:
    def run(py: PythonFacts) -> dict[str, CheckResult]:
        return by_name(run_checks(replace(h200x2, python=py)))

    assert run(PythonFacts("3.10.12", ">=3.11", h200x2.python.packages))["python"].status == "fail"
    drift = (PackageFact("llama-cpp-python", "==0.3.36", "0.3.16"), PackageFact("numpy", ">=1.26", "2.1.0"))
    assert run(PythonFacts("3.11.7", ">=3.11", drift))["packages"].status == "fail"
    old_numpy = (PackageFact("llama-cpp-python", "==0.3.36", "0.3.36"), PackageFact("numpy", ">=1.26", "1.24.4"))
    assert run(PythonFacts("3.11.7", ">=3.11", old_numpy))["packages"].status == "warn"
    gone = (PackageFact("fastapi", ">=0.110", None), PackageFact("diskcache", ">=5.6.1", None, "llama-cpp-python"))
    r = run(PythonFacts("3.11.7", ">=3.11", gone))["packages"]
    assert r.status == "fail" and "diskcache (for llama-cpp-python)" in r.detail
    assert r.fix and r.fix.startswith("pip install fastapi diskcache")
    no_llama = (PackageFact("llama-cpp-python", "==0.3.36", None),)
    r = run(PythonFacts("3.11.7", ">=3.11", no_llama))["packages"]
    assert r.status == "fail" and r.fix and "pip install" not in r.fix  # pip's own build would be -march=native
    local = (PackageFact("llama-cpp-python", "==0.3.36", "0.3.36+cu124"),)
    assert run(PythonFacts("3.11.7", ">=3.11", local))["packages"].status == "pass"


def test_ram_and_disk(h200x2: Facts, tmp_path: Path) -> None:
    def run(facts: Facts) -> dict[str, CheckResult]:
        return by_name(run_checks(facts))

    small_host = replace(h200x2, host=replace(h200x2.host, mem_available=3 * GIB))
    assert run(small_host)["ram"].status == "warn"  # on GPUs: a slow load, not a failure
    cpu_box = replace(small_host, inventory=write_inventory(tmp_path, "gpus: []\n"))
    assert run(cpu_box)["ram"].status == "fail"
    tight = replace(cpu_box, host=replace(cpu_box.host, mem_available=int(4.5 * GIB)))
    assert run(tight)["ram"].status == "warn"
    # the config's RAM tier of the KV cache is counted: 4 GiB of model and 500 GiB of tier do not fit 480 GiB
    tier = run(replace(h200x2, model=replace(h200x2.model, kv_tier_bytes=500 * GIB)))["ram"]
    assert tier.status == "fail" and "cache_ram_mib" in tier.detail and tier.fix and "cache_ram_mib" in tier.fix
    assert run(replace(h200x2, model=replace(h200x2.model, kv_tier_bytes=400 * GIB)))["ram"].status == "pass"
    assert run(replace(h200x2, model=replace(h200x2.model, cache_free=GIB)))["disk"].status == "warn"
    assert run(replace(h200x2, model=replace(h200x2.model, cache_free=100 * 2**20)))["disk"].status == "fail"


def test_model_resolution_and_file_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = default_model_path(progress=False)
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(f"model_path: {real}\ncontext_length: 2048\n")
    assert resolve_model(None, str(cfg)) == (str(real), "config fleet.yaml")
    assert resolve_model("x.gguf", str(cfg)) == ("x.gguf", "--model")
    cfg.write_text("model_pth: x\n")
    with pytest.raises(ConfigError, match="model_pth"):
        resolve_model(None, str(cfg))
    monkeypatch.setenv("LLAMAFLEET_CACHE", str(tmp_path / "empty-cache"))
    assert resolve_model(None, None) == (None, "none")

    facts = model_facts(str(real), "--model")
    assert facts.is_gguf and facts.size_bytes == real.stat().st_size and facts.cache_free
    pointer = tmp_path / "model.gguf"
    pointer.write_text("version https://git-lfs.github.com/spec/v1\n")
    base = healthy(write_inventory(tmp_path, H200X2))
    r = by_name(run_checks(replace(base, model=model_facts(str(pointer), "--model"))))["model"]
    assert r.status == "fail" and "not a GGUF" in r.detail
    r = by_name(run_checks(replace(base, model=model_facts(str(tmp_path / "nope.gguf"), "--model"))))["model"]
    assert r.status == "fail" and "not found" in r.detail


def test_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text("threads: many\n")
    assert main(["check-env", "--config", str(cfg)]) == 2
    assert "'threads'" in capsys.readouterr().err


def test_report_formats(h200x2: Facts) -> None:
    results = run_checks(replace(h200x2, devices=replace(h200x2.devices, cuda_visible_devices="")))
    text = format_text(results).splitlines()
    assert len(text) == len(results) + 1
    bad = next(line for line in text if line.startswith("FAIL  devices"))
    assert "-> fix: unset CUDA_VISIBLE_DEVICES" in bad
    assert all("-> fix" not in line for line in text if line.startswith("PASS"))
    assert text[-1] == f"check-env: {len(results) - 2} pass, 0 warn, 1 fail, 1 skip; exit code 2"
    doc = json.loads(format_json(h200x2, results))
    assert doc["exit_code"] == 2
    assert doc["facts"]["inventory"]["gpus"][1]["uuid"] == "GPU-9f8e7d6c"
    assert "amx_int8" in doc["facts"]["host"]["cpu_flags"]


def test_exit_code_ladder() -> None:
    def res(*statuses: Status) -> list[CheckResult]:
        return [CheckResult(str(i), s, "") for i, s in enumerate(statuses)]

    assert exit_code([]) == 0
    assert exit_code(res("pass", "skip")) == 0
    assert exit_code(res("pass", "warn", "skip")) == 1
    assert exit_code(res("warn", "fail", "pass")) == 2


def test_probe_runs_in_a_child_process() -> None:
    """The probe must work from a fresh interpreter: that is how gather() calls it."""
    proc = subprocess.run(
        [sys.executable, "-c", "from llamafleet.envcheck.gather import run_probe; run_probe()"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("llamafleet-envcheck-probe:"))
    data = json.loads(line.split(":", 1)[1])
    assert ("error" in data) != ("system_info" in data)
