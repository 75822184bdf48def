"""``llamafleet check-env``: is this machine ready to serve, and if not, what to fix.

Gather once (:func:`llamafleet.envcheck.gather.gather`), judge with pure functions (:func:`run_checks`), report
one line per check. Exit code (:func:`exit_code`): 0 every check passed or was skipped, 1 warnings, 2 failures.

The checks, in report order: python, packages, llama.cpp (loads, backends), cpu (build vs CPU, the AMX/SIGILL
trap), driver, gpus (memory), devices (``/dev/nvidia*`` vs what CUDA shows), offload (CPU-only wheel on a GPU
machine), cuda (runtime vs driver, architectures), interconnect (NVLink/PCIe and what it means for split vs
replicas), model, ram, disk. ``docs/CHECK_ENV.md`` explains each with its fixes.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from llamafleet.envcheck.facts import SEVERITY, CheckResult, Facts
from llamafleet.envcheck.gather import gather
from llamafleet.envcheck.gpu import (
    check_cuda,
    check_devices,
    check_driver,
    check_gpus,
    check_interconnect,
    check_offload,
)
from llamafleet.envcheck.host import (
    check_cpu,
    check_disk,
    check_llama,
    check_model,
    check_packages,
    check_python,
    check_ram,
)

__all__ = ["CheckResult", "Facts", "check_environment", "exit_code", "format_json", "format_text", "run_checks"]


def run_checks(facts: Facts, cpu_only: bool = False) -> list[CheckResult]:
    """Every check over ``facts``; ``cpu_only`` says a machine without GPU is intended (no GPU is then a pass)."""
    f = facts
    return [
        check_python(f),
        check_packages(f),
        check_llama(f),
        check_cpu(f),
        check_driver(f, cpu_only),
        check_gpus(f),
        check_devices(f),
        check_offload(f),
        check_cuda(f),
        check_interconnect(f),
        check_model(f),
        check_ram(f),
        check_disk(f),
    ]


def exit_code(results: list[CheckResult]) -> int:
    """0 when nothing warned or failed, 1 when the worst is a warning, 2 when anything failed."""
    return max((SEVERITY[r.status] for r in results), default=0)


def check_environment(
    model: str | None = None, config_path: str | None = None, cpu_only: bool = False
) -> tuple[Facts, list[CheckResult]]:
    """Gather this machine's facts and judge them."""
    facts = gather(model, config_path)
    return facts, run_checks(facts, cpu_only)


def format_text(results: list[CheckResult]) -> str:
    """One line per check (``STATUS name  detail  -> fix``), then a summary line with the exit code."""
    width = max((len(r.name) for r in results), default=0)
    lines = []
    for r in results:
        line = f"{r.status.upper():4}  {r.name:<{width}}  {r.detail}"
        if r.fix and r.status in ("warn", "fail"):
            line += f"  -> fix: {r.fix}"
        lines.append(line)
    counts = ", ".join(f"{sum(r.status == s for r in results)} {s}" for s in ("pass", "warn", "fail", "skip"))
    lines.append(f"check-env: {counts}; exit code {exit_code(results)}")
    return "\n".join(lines)


def format_json(facts: Facts, results: list[CheckResult]) -> str:
    """The results, the exit code and the gathered facts, for machines."""
    doc = {
        "exit_code": exit_code(results),
        "checks": [asdict(r) for r in results],
        "facts": asdict(facts),
    }
    return json.dumps(doc, indent=2, default=sorted)  # frozensets (CPU flags) become sorted lists
