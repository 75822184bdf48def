"""check-env on GPU machines we do not have, described by inventory files and facts: one situation per test."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from envcheck_machines import CUDA_LIBS, GIB, H200X2, PORTABLE_CPU, by_name, h200x2_facts, healthy, write_inventory

from llamafleet.envcheck.facts import CheckResult, DeviceFacts, DriverFacts, Facts, LlamaBuild
from llamafleet.envcheck.gpu import visible_gpus
from llamafleet.envcheck.run import exit_code, run_checks


@pytest.fixture
def h200x2(tmp_path: Path) -> Facts:
    return h200x2_facts(tmp_path)


def test_healthy_gpu_server_passes_everything(h200x2: Facts) -> None:
    results = run_checks(h200x2)
    assert [r for r in results if r.status not in ("pass", "skip")] == []
    assert exit_code(results) == 0
    r = by_name(results)
    assert "tensor split" in r["interconnect"].detail
    assert "CUDA 12.4 for sm_90" in r["cuda"].detail
    assert "portable build does not use it" in r["cpu"].detail  # AMX advertised, portable build: no trap


def test_cpu_only_wheel_on_gpu_server_fails(h200x2: Facts) -> None:
    ll = LlamaBuild(
        found=True,
        version="0.3.36",
        lib_names=CUDA_LIBS[:2] + CUDA_LIBS[3:],
        loaded=True,
        offload=False,
        system_info=PORTABLE_CPU,
    )
    r = by_name(run_checks(replace(h200x2, llama=ll)))
    assert r["offload"].status == "fail" and "2 GPU(s)" in r["offload"].detail
    assert r["offload"].fix and "LLAMAFLEET_BACKEND=cuda" in r["offload"].fix
    assert r["cuda"].status == "skip"  # one problem, one failure
    assert r["ram"].detail.endswith("runs on the CPU from RAM")
    assert exit_code(run_checks(replace(h200x2, llama=ll))) == 2


def test_driver_older_than_the_cuda_runtime(h200x2: Facts, tmp_path: Path) -> None:
    cuda13 = replace(h200x2.llama, needed=("libcudart.so.13",), cudart_file=None)
    r = by_name(run_checks(replace(h200x2, llama=cuda13)))["cuda"]
    assert r.status == "fail" and "too old for CUDA 13" in r.detail
    newer_minor = replace(h200x2.llama, cudart_file="libcudart.so.12.8.90")
    r = by_name(run_checks(replace(h200x2, llama=newer_minor)))["cuda"]
    assert r.status == "warn" and "minor-version compatibility" in r.detail


@pytest.mark.parametrize(
    ("archs", "cap", "status"),
    [("900", "9.0", "pass"), ("860", "8.9", "pass"), ("800", "9.0", "warn"), ("1000", "9.0", "fail")],
)
def test_cuda_architectures_against_compute_capability(h200x2: Facts, archs: str, cap: str, status: str) -> None:
    ll = replace(h200x2.llama, system_info=PORTABLE_CPU + f"CUDA : ARCHS = {archs} | ")
    facts = replace(h200x2, llama=ll, driver=replace(h200x2.driver, compute_caps=(cap, cap)))
    assert by_name(run_checks(facts))["cuda"].status == status


def test_non_cuda_gpu_backend_warns(h200x2: Facts) -> None:
    ll = replace(h200x2.llama, lib_names=("libggml-base.so", "libggml-vulkan.so", "libllama.so"), needed=())
    r = by_name(run_checks(replace(h200x2, llama=ll)))
    assert r["cuda"].status == "warn" and "vulkan" in r["cuda"].detail
    assert r["offload"].status == "pass"


@pytest.mark.parametrize(
    ("cvd", "shown", "ignored"),
    [
        (None, 2, ()),
        ("", 0, ()),
        ("1", 1, ()),
        ("1,0", 2, ()),
        ("0,7,1", 1, ("7", "1")),
        ("1,1", 1, ("1",)),
        ("GPU-9f8e", 1, ()),
        ("GPU-", 0, ("GPU-",)),
        ("-1", 0, ("-1",)),
    ],
)
def test_visible_gpus_follows_cuda_rules(tmp_path: Path, cvd: str | None, shown: int, ignored: tuple[str, ...]) -> None:
    vis, ign = visible_gpus(write_inventory(tmp_path, H200X2), cvd)
    assert (len(vis), ign) == (shown, ignored)


def test_cuda_visible_devices_and_device_files(h200x2: Facts) -> None:
    def devices(**kw: Any) -> CheckResult:
        return by_name(run_checks(replace(h200x2, devices=replace(h200x2.devices, **kw))))["devices"]

    assert devices().status == "pass"
    hidden = devices(cuda_visible_devices="")
    assert hidden.status == "fail" and "hides every GPU" in hidden.detail
    one = devices(cuda_visible_devices="1")
    assert one.status == "warn" and "shows 1 of 2" in one.detail
    assert devices(files=()).status == "fail"
    locked = devices(unusable=("/dev/nvidia1",))
    assert locked.status == "fail" and locked.fix and "group" in locked.fix
    boxed = devices(in_container=True, nvidia_visible_devices="0")
    assert boxed.status == "warn" and boxed.fix and "--gpus all" in boxed.fix
    assert devices(in_container=True, nvidia_visible_devices="all").status == "pass"
    # Only one GPU visible: interconnect has nothing to judge.
    facts = replace(h200x2, devices=replace(h200x2.devices, cuda_visible_devices="0"))
    assert by_name(run_checks(facts))["interconnect"].status == "skip"


def test_driver_states(h200x2: Facts, tmp_path: Path) -> None:
    empty = write_inventory(tmp_path, "gpus: []\n")
    broken = replace(
        h200x2,
        inventory=empty,
        driver=DriverFacts(True, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
    )
    r = by_name(run_checks(broken))
    assert r["driver"].status == "fail" and "couldn't communicate" in r["driver"].detail
    assert r["devices"].status == "skip" and r["gpus"].status == "skip"
    nothing = replace(broken, driver=DriverFacts(False), devices=DeviceFacts())
    assert by_name(run_checks(nothing))["driver"].status == "warn"
    assert by_name(run_checks(nothing, cpu_only=True))["driver"].status == "pass"


def test_busy_gpu_warns(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, "gpus:\n  - {total_mib: 81920, free_mib: 20000}\n  - {total_mib: 81920}\n")
    r = by_name(run_checks(healthy(inv)))["gpus"]
    assert r.status == "warn" and r.detail.count("GPU 0") == 2  # listed, then named as busy


def test_interconnect_advice(tmp_path: Path) -> None:
    pcie = healthy(write_inventory(tmp_path, H200X2.replace("nvlink", "pcie")))
    r = by_name(run_checks(pcie))["interconnect"]
    assert r.status == "pass" and "one replica per GPU" in r.detail
    big = replace(pcie, model=replace(pcie.model, size_bytes=150 * GIB))
    r = by_name(run_checks(big))["interconnect"]
    assert r.status == "warn" and "does not fit one GPU" in r.detail
    islands = """
gpus: [{total_mib: 81920}, {total_mib: 81920}, {total_mib: 81920}, {total_mib: 81920}]
links:
  - [self, nvlink, pcie, pcie]
  - [nvlink, self, pcie, pcie]
  - [pcie, pcie, self, nvlink]
  - [pcie, pcie, nvlink, self]
"""
    four = healthy(write_inventory(tmp_path, islands))
    four = replace(four, model=replace(four.model, size_bytes=120 * GIB))  # needs two 80 GiB GPUs
    r = by_name(run_checks(four))["interconnect"]
    assert r.status == "pass" and "0,1 | 2,3" in r.detail and "fits one NVLink group" in r.detail
