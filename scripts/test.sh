#!/usr/bin/env bash
# The project's test command: install (idempotent, cached) with the test tools, then lint, type-check and run the
# whole test suite. Extra arguments go to pytest (e.g. `scripts/test.sh -k engine`).
#
# Besides what serving needs (scripts/install.sh), it installs
#   - the extras dev (pytest, mypy, ruff, the OpenAI and Anthropic SDKs, websockets), ray (Ray, about 250 MB:
#     the Ray tests start a local multi-node cluster) and torch (PyTorch's CPU build and transformers: the torch
#     engine's tests);
#   - Debian's Chromium (about 100 MB), once, for the dashboard's browser test. This is the one step that needs
#     root (apt-get); without root or apt it says so, and that test fails naming the fix
#     (`sudo apt-get install chromium`, or LLAMAFLEET_CHROMIUM=/path/to/chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMAFLEET_EXTRAS=${LLAMAFLEET_EXTRAS:-dev,ray,torch} bash scripts/install.sh

CHROMIUM=${LLAMAFLEET_CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "==> installing Chromium (Debian's package, about 100 MB) for the dashboard's browser test, once (as root)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; then
      echo "test.sh: warning: apt-get could not install chromium; the dashboard's browser test will fail" >&2
    fi
  else
    echo "test.sh: warning: $CHROMIUM is missing and installing it needs root and apt-get (this is the only step" \
         "of the tests that does); the dashboard's browser test will fail. Fix: sudo apt-get install chromium," \
         "or set LLAMAFLEET_CHROMIUM to a Chromium binary" >&2
  fi
fi

echo "==> ruff"
.venv/bin/ruff check src tests scripts
# mypy keeps what it learned of each unchanged file (its cache is checked against the files' contents, wherever the
# checkout is) beside the built wheels, so that a new clone is checked in seconds instead of about 40 s.
echo "==> mypy"
.venv/bin/mypy --cache-dir "${LLAMAFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llamafleet}/mypy"
# pytest runs the test modules on WORKERS processes (pytest-xdist): each module whole on one worker (its servers are
# started once), in the order they are collected, so the long integration modules go first and the many short unit
# modules last, and both workers end together. Alone, a run keeps about one core busy: its servers wait for one
# another, for timeouts and for the client. Default: 2 workers where there are 2 cores or more, else 1 (one process);
# LLAMAFLEET_TEST_WORKERS=N sets it.
WORKERS=${LLAMAFLEET_TEST_WORKERS:-$([ "$(nproc)" -ge 2 ] && echo 2 || echo 1)}
parallel=()
[ "$WORKERS" -gt 1 ] && parallel=(-n "$WORKERS" --dist loadfile --no-loadscope-reorder)
echo "==> pytest on $WORKERS worker(s) (the 15 slowest tests are listed at the end)"
set +e
.venv/bin/python -m pytest "${parallel[@]}" --durations=15 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"
