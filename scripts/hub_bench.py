"""A model's download through llamafleet's path against ``huggingface_hub``'s own ``hf_hub_download``, side by side in
one run, from the test suite's local hub (tests/hub_server.py) on loopback.

    python scripts/hub_bench.py [--size-mb 1024] [--reps 3] [--json OUT.json]

The hub runs in a process of its own. Ours is what ``llamafleet pull`` does: resolve the reference (one API call),
check the disk, ``hf_hub_download`` into the hub cache with the sha256 computed as the file is written, checked
against the hub's LFS metadata. Theirs is ``hf_hub_download`` alone. Each rep runs both,
in alternating order, each into an empty cache; the ratio is of the best times (the machine may be shared), and
each run's CPU time (this process's, every thread) says what the sha256 costs. The file is random bytes (a download
is bytes; its content does not matter here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hub-bench-"))
    try:
        run(work, args)
    finally:
        shutil.rmtree(work)


def run(work: Path, args: argparse.Namespace) -> None:
    blob = work / "bench-Q8_0.gguf"
    with blob.open("wb") as f:
        for _ in range(args.size_mb):
            f.write(os.urandom(1 << 20))
    hub = subprocess.Popen([sys.executable, str(TESTS / "hub_server.py"), "bench/bench-GGUF", str(blob)],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert hub.stdout is not None
        url = hub.stdout.readline().strip()
        times, cpu = compare(work, blob, url, args.reps, args.size_mb)
    finally:
        hub.kill()
        hub.wait()
    best = {k: min(v) for k, v in times.items()}
    median = {k: statistics.median(v) for k, v in times.items()}
    ratio = best["hf_hub_download"] / best["llamafleet"]
    ratio_median = median["hf_hub_download"] / median["llamafleet"]
    print(f"best: llamafleet {best['llamafleet']:.2f} s, hf_hub_download {best['hf_hub_download']:.2f} s; "
          f"llamafleet at {100 * ratio:.0f}% of hf_hub_download's rate ({100 * ratio_median:.0f}% by the medians)")
    if args.json:
        args.json.write_text(json.dumps({"size_mib": args.size_mb, "reps": args.reps, "seconds": times, "cpu_s": cpu,
                                         "best_s": best, "median_s": median, "ratio": ratio,
                                         "ratio_median": ratio_median, "load": os.getloadavg(),
                                         "cpus": os.cpu_count()}, indent=2) + "\n")


Runs = dict[str, list[float]]


def compare(work: Path, blob: Path, url: str, reps: int, size_mb: int) -> tuple[Runs, Runs]:
    """Seconds and CPU seconds (this process's, every thread) of each run of each path."""
    os.environ |= {"HF_ENDPOINT": url, "HF_HUB_CACHE": str(work / "cache"), "HF_HUB_DISABLE_TELEMETRY": "1",
                   "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    # huggingface_hub reads its settings when imported: after the environment is set
    from huggingface_hub import hf_hub_download

    from llamafleet.model.hub import fetch, resolve
    from llamafleet.model.hub_ref import parse_ref

    def ours() -> None:
        fetch(resolve(parse_ref("hf:bench/bench-GGUF:Q8_0")))

    def theirs() -> None:
        hf_hub_download("bench/bench-GGUF", blob.name)

    times: Runs = {"llamafleet": [], "hf_hub_download": []}
    cpu: Runs = {"llamafleet": [], "hf_hub_download": []}
    for rep in range(reps):
        order = [("llamafleet", ours), ("hf_hub_download", theirs)]
        for name, fn in order if rep % 2 == 0 else order[::-1]:
            shutil.rmtree(work / "cache", ignore_errors=True)
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            print(f"rep {rep} {name}: {times[name][-1]:.2f} s ({size_mb / times[name][-1]:.0f} MiB/s), "
                  f"CPU {cpu[name][-1]:.2f} s", flush=True)
    return times, cpu


if __name__ == "__main__":
    main()
