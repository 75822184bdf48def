#!/usr/bin/env bash
# threads = cores vs cores - 1, with the CPU quiet and with one busy process beside it: `llamafleet bench engine` on
# the demo model (4 requests x 48 tokens, sequential then concurrent, as issue 30 measured it), ROUNDS rounds. Each
# run's JSON goes to OUT, with `uptime` before and after; a markdown table of tokens/s goes to stdout
# (docs/BENCHMARKS.md, "Threads on a busy CPU"). Run it on a machine with nothing else running.
#
# Usage: scripts/threads_bench.sh [OUT]     (default OUT: bench-out/threads; ROUNDS=2 REQUESTS=4 MAX_TOKENS=48)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/threads}
ROUNDS=${ROUNDS:-2}
REQUESTS=${REQUESTS:-4}
MAX_TOKENS=${MAX_TOKENS:-48}
CORES=$(.venv/bin/python -c 'from llamafleet.engine.cores import host_cores; print(host_cores())')
[ "$CORES" -ge 2 ] || { echo "threads_bench.sh: needs 2 or more cores (this process may use $CORES)" >&2; exit 2; }
mkdir -p "$OUT"
uptime | tee "$OUT/uptime-before.txt" >&2

BUSY=""
stop_busy() { if [ -n "$BUSY" ]; then kill "$BUSY" 2>/dev/null || true; wait "$BUSY" 2>/dev/null || true; BUSY=""; fi; }
trap stop_busy EXIT
for round in $(seq "$ROUNDS"); do
  for load in quiet busy; do
    if [ "$load" = busy ]; then
      .venv/bin/python -c 'while True: pass' &  # one busy process: a core's worth of other work
      BUSY=$!
    fi
    for threads in "$CORES" $((CORES - 1)); do
      echo "==> round $round, $load, threads $threads" >&2
      .venv/bin/llamafleet bench engine --requests "$REQUESTS" --max-tokens "$MAX_TOKENS" --threads "$threads" \
        --json > "$OUT/$load-threads$threads-round$round.json"
    done
    stop_busy
  done
done
uptime | tee "$OUT/uptime-after.txt" >&2

.venv/bin/python - "$OUT" "$CORES" <<'PY'
import json
import sys
from pathlib import Path

out, cores = Path(sys.argv[1]), int(sys.argv[2])
print(f"| {cores} cores | sequential tok/s | concurrent tok/s |\n|---|---:|---:|")
for load, words in (("quiet", "quiet"), ("busy", "one busy process beside it")):
    for threads in (cores, cores - 1):
        runs = [json.loads(p.read_text()) for p in sorted(out.glob(f"{load}-threads{threads}-round*.json"))]
        rates = {ph: [next(x for x in r["phases"] if x["name"] == ph)["tokens_per_s"] for r in runs]
                 for ph in ("sequential", "concurrent")}
        cells = [f"{min(v):.0f}-{max(v):.0f}" if len(v) > 1 else f"{v[0]:.0f}" for v in rates.values()]
        name = "cores" if threads == cores else "cores - 1"
        print(f"| {words}, threads = {threads} ({name}) | {cells[0]} | {cells[1]} |")
PY
