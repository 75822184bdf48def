#!/usr/bin/env bash
# The project's test command: install (idempotent, cached), then lint, type-check and run the whole test suite.
# Extra arguments go to pytest (e.g. `scripts/test.sh -k engine`).
set -euo pipefail
cd "$(dirname "$0")/.."
# the ray extra too: the Ray tests (a local multi-node cluster) run in CI
LLAMAFLEET_EXTRAS=${LLAMAFLEET_EXTRAS:-dev,ray} bash scripts/install.sh
echo "==> ruff"
.venv/bin/ruff check src tests scripts
echo "==> mypy"
.venv/bin/mypy
echo "==> pytest"
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"
