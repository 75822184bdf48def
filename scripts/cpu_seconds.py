"""The CPU seconds a command and every process it starts use, orphans included: the way to time a test module on a
machine shared with other work (its wall time there says little).

    python scripts/cpu_seconds.py .venv/bin/python -m pytest -q tests/integration/test_server_api.py

It runs the command as a child subreaper (Linux), so a server's workers that outlive their parent are handed here and
counted when they end; it prints one line on stderr, ``CPU user=…s sys=…s total=…s wall=…s rc=…``, and exits with
the command's status. It waits for every descendant: a process left running keeps it waiting.
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("cpu_seconds: cannot become a child subreaper (Linux only)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    rc = subprocess.Popen(argv).wait()
    while True:  # the orphans handed to this process, until none is left
        try:
            os.wait()
        except ChildProcessError:
            break
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"CPU user={ru.ru_utime:.1f}s sys={ru.ru_stime:.1f}s total={ru.ru_utime + ru.ru_stime:.1f}s "
          f"wall={time.monotonic() - t0:.1f}s rc={rc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
