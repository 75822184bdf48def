"""The GPU half of ``llamafleet check-env``: driver, GPUs, device files, GPU offload, CUDA versions, interconnect.

Each check is a pure function of :class:`~llamafleet.envcheck.facts.Facts` returning one
:class:`~llamafleet.envcheck.facts.CheckResult`, so any machine can be described in a test. When one problem has a
cause reported by an earlier check (no GPU, llama.cpp did not load), later checks say ``skip`` instead of failing
again, so each problem is counted once.
"""

from __future__ import annotations

import re

from llamafleet.envcheck.facts import CheckResult, Facts, Finding, combine, size_text
from llamafleet.placement.gpus import Gpu, Inventory

REBUILD_CUDA = "rebuild llama.cpp with CUDA: LLAMAFLEET_BACKEND=cuda scripts/install.sh"
BUSY_SHARE = 0.10  # a GPU with more than this share of its memory already taken gets a warning


def visible_gpus(inv: Inventory, cuda_visible_devices: str | None) -> tuple[tuple[Gpu, ...], tuple[str, ...]]:
    """The GPUs CUDA shows this process under ``CUDA_VISIBLE_DEVICES``, and the entries it ignores.

    Unset means every GPU, empty means none. CUDA reads the list left to right and stops at the first entry that
    names no GPU (an index out of range, an unknown UUID, a repeat): that entry and all after it are ignored.
    Which GPU an index means depends on ``CUDA_DEVICE_ORDER``; how many are shown does not.
    """
    if cuda_visible_devices is None:
        return inv.gpus, ()
    entries = [e.strip() for e in cuda_visible_devices.split(",")] if cuda_visible_devices.strip() else []
    shown: list[Gpu] = []
    for k, entry in enumerate(entries):
        gpu = _named_gpu(inv, entry)
        if gpu is None or gpu in shown:
            return tuple(shown), tuple(entries[k:])
        shown.append(gpu)
    return tuple(shown), ()


def _named_gpu(inv: Inventory, entry: str) -> Gpu | None:
    if entry.isdigit():
        pos = int(entry)
        return inv.gpus[pos] if pos < len(inv.gpus) else None
    matches = [g for g in inv.gpus if entry and g.uuid and g.uuid.startswith(entry)]  # CUDA takes unique prefixes
    return matches[0] if len(matches) == 1 else None


def check_driver(f: Facts, cpu_only: bool) -> CheckResult:
    """Is an NVIDIA driver there and does it answer? No trace of one is a warning (pass with ``cpu_only``)."""
    inv, drv, dev = f.inventory, f.driver, f.devices
    if inv.gpus:
        return CheckResult(
            "driver",
            "pass",
            f"NVIDIA driver {inv.driver_version or '(version unknown)'}, supports CUDA "
            f"{inv.cuda_driver_version or '(unknown)'}; {len(inv.gpus)} GPU(s) found through {inv.source}",
        )
    traces = []
    if drv.kernel_module:
        traces.append("the nvidia kernel module is loaded")
    if dev.files:
        traces.append(f"{len(dev.files)} /dev/nvidia* GPU device file(s) exist")
    if drv.nvidia_smi:
        traces.append("nvidia-smi is installed")
    if traces:
        said = drv.smi_error or inv.note or "it lists no GPU"
        return CheckResult(
            "driver",
            "fail",
            f"an NVIDIA driver is present ({', '.join(traces)}) but no GPU answers: {said}",
            "run nvidia-smi; after a driver update reboot (or reload the nvidia module) so the kernel module and "
            "the user-space driver match; in a container, start it with --gpus all",
        )
    detail = "no NVIDIA GPU: no driver, no nvidia-smi, no /dev/nvidia* devices; llamafleet will serve on the CPU"
    if cpu_only:
        return CheckResult("driver", "pass", f"{detail} (--cpu-only: as intended)")
    fix = "on a CPU-only machine pass --cpu-only; on a GPU machine install the NVIDIA driver (nvidia-smi must list "
    fix += "the GPUs)"
    if dev.in_container:
        fix += "; in this container: restart it with --gpus all (NVIDIA Container Toolkit)"
    return CheckResult("driver", "warn", detail, fix)


def check_gpus(f: Facts) -> CheckResult:
    """Every GPU with its total and free memory; memory already taken by someone else is a warning."""
    gpus = f.inventory.gpus
    if not gpus:
        return CheckResult("gpus", "skip", "no GPU")
    summary = "; ".join(f"GPU {g.index} {g.name}: {g.free_mib} of {g.total_mib} MiB free" for g in gpus)
    busy = [g for g in gpus if g.total_mib - g.free_mib > BUSY_SHARE * g.total_mib]
    findings = []
    if busy:
        names = ", ".join(str(g.index) for g in busy)
        findings.append(
            Finding(
                "warn",
                f"GPU {names}: over {BUSY_SHARE:.0%} of the memory is already taken by other processes",
                "see nvidia-smi for the processes holding memory and stop them, or leave those GPUs out with "
                "'gpus: [...]' in fleet.yaml (the planner counts only free memory)",
            )
        )
    return combine("gpus", summary, findings)


def check_devices(f: Facts) -> CheckResult:
    """Device files against the GPUs the driver reports and the GPUs CUDA will show this process."""
    inv, dev = f.inventory, f.devices
    n, d = len(inv.gpus), len(dev.files)
    if n == 0:
        if d == 0:
            return CheckResult("devices", "skip", "no GPU")
        return CheckResult("devices", "skip", f"{d} GPU device file(s) but the driver answers for none (see driver)")
    findings = []
    if d == 0:
        findings.append(
            Finding(
                "fail",
                "no /dev/nvidia[0-9] device files: CUDA cannot open any GPU",
                "in a container start it with --gpus all (or pass each /dev/nvidia* with --device)",
            )
        )
    elif d != n:
        findings.append(Finding("warn", f"{d} GPU device file(s) but the driver reports {n} GPU(s)"))
    if dev.unusable:
        findings.append(
            Finding(
                "fail",
                f"this user may not open {', '.join(dev.unusable)}",
                "add the user to the group that owns the device files (often 'video' or 'render'), then log in again",
            )
        )
    shown, ignored = visible_gpus(inv, dev.cuda_visible_devices)
    cvd = f"CUDA_VISIBLE_DEVICES={dev.cuda_visible_devices!r}"
    unset_fix = "unset CUDA_VISIBLE_DEVICES (llamafleet gives each worker its own GPUs) or list the GPUs to use"
    if ignored:
        findings.append(
            Finding("warn", f"{cvd}: CUDA ignores {', '.join(ignored)} and everything after (names no GPU)", unset_fix)
        )
    if not shown:
        findings.append(Finding("fail", f"{cvd} hides every GPU: llama.cpp will run on the CPU", unset_fix))
    elif len(shown) < n:
        findings.append(Finding("warn", f"{cvd} shows {len(shown)} of {n} GPUs; only those will be used", unset_fix))
    nvd = dev.nvidia_visible_devices
    if dev.in_container and nvd is not None and nvd.strip().lower() != "all":
        findings.append(
            Finding(
                "warn",
                f"this container was given only NVIDIA_VISIBLE_DEVICES={nvd!r}: other GPUs of the host are out of "
                "reach",
                "start the container with --gpus all to let llamafleet use every GPU of the host",
            )
        )
    where = "in a container" if dev.in_container else "on the host"
    summary = f"{d} GPU device file(s), {len(shown)} of {n} GPU(s) visible to CUDA ({where})"
    return combine("devices", summary, findings)


def check_offload(f: Facts) -> CheckResult:
    """Was llama.cpp compiled with GPU offload? A CPU-only build on a GPU machine is the silent slowdown."""
    ll, gpus = f.llama, f.inventory.gpus
    if not ll.loaded:
        return CheckResult("offload", "skip", "llama.cpp did not load (see llama.cpp)")
    if ll.offload:
        backends = ", ".join(ll.backends) or "a GPU backend"
        return CheckResult("offload", "pass", f"GPU offload compiled in ({backends})")
    if gpus:
        return CheckResult(
            "offload",
            "fail",
            f"llama.cpp was built for the CPU only, but this machine has {len(gpus)} GPU(s): every layer would run "
            "on the CPU, many times slower, without any error",
            REBUILD_CUDA,
        )
    return CheckResult("offload", "pass", "CPU-only build, which suits a machine without GPU")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


def _arch_findings(caps: tuple[str, ...], archs: tuple[tuple[int, int], ...]) -> list[Finding]:
    """GPUs whose compute capability the compiled kernels do not cover."""
    missing: set[str] = set()
    jit_only: set[str] = set()
    for cap in caps:
        if not re.fullmatch(r"\d+\.\d+", cap):
            continue
        major, minor = (int(x) for x in cap.split("."))
        if any(a == major and b <= minor for a, b in archs):
            continue  # same-major binary code runs on equal or newer minor versions
        (jit_only if any((a, b) < (major, minor) for a, b in archs) else missing).add(cap)
    built = ", ".join(f"sm_{a}{b}" for a, b in archs)
    fix = "rebuild for these GPUs: CUDA_ARCHITECTURES=<e.g. 90> LLAMAFLEET_BACKEND=cuda scripts/install.sh"
    out = []
    if missing:
        caps_txt = ", ".join(sorted(missing))
        out.append(Finding("fail", f"kernels built for {built} cannot run on compute capability {caps_txt}", fix))
    if jit_only:
        caps_txt = ", ".join(sorted(jit_only))
        out.append(
            Finding(
                "warn",
                f"kernels built for {built} reach compute capability {caps_txt} only by JIT compiling PTX (slow first "
                "start; fails if the build embedded no PTX)",
                fix,
            )
        )
    return out


def check_cuda(f: Facts) -> CheckResult:
    """The CUDA llama.cpp was built with against what the driver supports, and the GPU architectures it covers."""
    inv, ll = f.inventory, f.llama
    if not inv.gpus:
        return CheckResult("cuda", "skip", "no GPU")
    if not ll.found:
        return CheckResult("cuda", "skip", "llama-cpp-python is not installed (see llama.cpp)")
    if "cuda" not in ll.backends:
        if ll.offload:
            return CheckResult(
                "cuda",
                "warn",
                f"llama.cpp offloads through {', '.join(ll.backends) or 'a non-CUDA backend'}, not CUDA; "
                "llamafleet is built and measured with CUDA on NVIDIA GPUs",
                REBUILD_CUDA,
            )
        return CheckResult("cuda", "skip", "llama.cpp has no CUDA backend (see offload)")
    runtime, driver = ll.cuda_runtime, inv.cuda_driver_version
    summary = f"llama.cpp built with CUDA {runtime or '(runtime version unknown)'}"
    if ll.cuda_archs:
        summary += " for " + ", ".join(f"sm_{a}{b}" for a, b in ll.cuda_archs)
    summary += f"; the driver supports CUDA {driver or '(unknown)'}"
    findings = []
    if runtime and driver:
        rt, dv = _version(runtime), _version(driver)
        driver_fix = (
            f"install an NVIDIA driver that supports CUDA {runtime} or newer, or rebuild llama.cpp with a CUDA "
            f"toolkit no newer than {driver}"
        )
        if dv[:1] < rt[:1]:
            text = f"the driver is too old for CUDA {rt[0]}: llama.cpp cannot start on the GPU"
            findings.append(Finding("fail", text, driver_fix))
        elif len(rt) > 1 and dv < rt:
            findings.append(
                Finding(
                    "warn",
                    f"the driver's CUDA {driver} is older than the runtime's {runtime}: minor-version compatibility "
                    "runs it, but kernels that need JIT compilation (PTX) fail",
                    driver_fix,
                )
            )
    findings += _arch_findings(f.driver.compute_caps, ll.cuda_archs)
    return combine("cuda", summary, findings)


def _nvlink_islands(inv: Inventory, gpus: tuple[Gpu, ...]) -> list[list[int]]:
    """Groups of GPUs (NVML indices) joined by NVLink, directly or through each other."""
    pos = {g.index: inv.position(g.index) for g in gpus}
    islands: list[list[int]] = []
    seen: set[int] = set()
    for g in gpus:
        if g.index in seen:
            continue
        island, todo = [], [g.index]
        seen.add(g.index)
        while todo:
            i = todo.pop()
            island.append(i)
            for j in pos:
                if j not in seen and inv.link(pos[i], pos[j]) == "nvlink":
                    seen.add(j)
                    todo.append(j)
        islands.append(sorted(island))
    return islands


def check_interconnect(f: Facts) -> CheckResult:
    """NVLink or PCIe between the visible GPUs, and what that means for split replicas versus one per GPU."""
    inv = f.inventory
    shown, _ = visible_gpus(inv, f.devices.cuda_visible_devices)
    if len(shown) < 2:
        return CheckResult("interconnect", "skip", f"{len(shown)} visible GPU: nothing to connect")
    islands = _nvlink_islands(inv, shown)
    if len(islands) == 1:
        return CheckResult(
            "interconnect",
            "pass",
            f"NVLink between all {len(shown)} GPUs: a model that fits one GPU is fastest as one replica per GPU; "
            "tensor split pays off for a model that does not fit one GPU or to lower single-stream latency",
        )
    if all(len(i) == 1 for i in islands):
        summary = (
            f"PCIe only between the {len(shown)} GPUs: serve one replica per GPU (no traffic between GPUs); "
            "avoid tensor split"
        )
    else:
        groups = " | ".join(",".join(map(str, i)) for i in islands)
        summary = f"NVLink within GPU groups {groups}, PCIe between them: keep each split replica inside one group"
    size = f.model.size_bytes
    free = {g.index: g.free_mib * 2**20 for g in shown}
    if size is None:
        return CheckResult("interconnect", "pass", summary)
    need = size * 1.1 + 2**30  # weights + KV cache and buffers, roughly
    if max(free.values()) >= need:
        return CheckResult("interconnect", "pass", summary)
    if any(len(i) > 1 and sum(free[j] for j in i) >= need for i in islands):
        return CheckResult("interconnect", "pass", f"{summary}; the model ({size_text(size)}) fits one NVLink group")
    finding = Finding(
        "warn",
        f"the model ({size_text(size)}) does not fit one GPU ({size_text(max(free.values()))} free at most), so it "
        "must be split and every token crosses PCIe",
        "prefer layer split over tensor split on PCIe, a smaller quantization that fits one GPU, or NVLink-connected "
        "GPUs; 'llamafleet plan' shows the exact memory budget",
    )
    return combine("interconnect", summary, [finding])
