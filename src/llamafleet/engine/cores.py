"""The CPU cores this process may use, and how many threads llama.cpp gets of them when ``threads`` is unset.

The default leaves one core free. llama.cpp's threads spin while they wait for each other at every operation, so a
core taken by anything else (the server's own Python threads, the API process, another program) stalls all of
them: on 2 cores with one busy process beside it, 2 threads ran 3.5x slower than 1 thread did (docs/BENCHMARKS.md,
"Threads on a busy CPU"). One thread fewer costs at most that thread's share on an idle machine.
"""

from __future__ import annotations

import os


def host_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_threads(replicas: int = 1) -> int:
    """llama.cpp threads per replica when ``threads`` is unset: every core but one, shared between ``replicas``
    running on this CPU, at least 1 each."""
    return max(1, (host_cores() - 1) // max(1, replicas))
