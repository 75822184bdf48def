#!/usr/bin/env bash
# Sessions that outnumber the slots: conversations with private contexts, replayed turn by turn
# (`llamafleet bench multiturn --private-tokens P --by-turn`), against three servers one after another, same model,
# same slots and context per slot, in one run:
#   llamafleet-tiers      llamafleet serve with its KV tiers (PARK parked sessions, RAM --cache-ram, and a disk tier
#                         in OUT/kv-cache)
#   llamafleet-no-tiers   llamafleet serve with --cache-ram 0 (slots only)
#   llama-server          llama.cpp's server with its RAM prompt cache (--cache-ram)
# then `llamafleet bench --compare` of the three. On CPU it is the workload of the KV-tiers issue; scripts/gpu-bench.sh
# runs it on a GPU (phase `sessions`).
#
#   MODEL=FILE LLAMA_SERVER=BIN scripts/sessions-bench.sh OUT_DIR
#
# Environment (defaults: the CPU workload): SESSIONS 6, TURNS 3, PRIVATE 870 (one-token words of each session's own
# context), SYSTEM 0 (shared system prompt words), CONC 2 (turns in flight), SLOTS 2, CTX 4096 (per slot),
# MAX_TOKENS 32, CACHE_RAM 2048 (MiB, llama-server's and llamafleet's RAM tier), FLEET_CACHE_RAM (llamafleet's
# alone; default CACHE_RAM), DISK_MIB 20480 (llamafleet's disk tier), PARK 0 (llamafleet's --cache-park: sessions
# parked in the context), KV f16 (the KV cache's type, both servers: f16, q8_0, q4_0), BY_TURN 1 (0: each of the
# CONC workers runs one conversation's turns back to back; with CONC above SLOTS, sessions still outnumber the
# slots), SEED 7, THREADS (default: every core), DEADLINE (seconds after which a replay sends no more turns: those
# in flight finish, the rest are reported as not sent; default none),
# DEVICE cpu|gpu (gpu: llama-server gets -ngl 99 -fa on; llamafleet places itself), PORT 18090, PYTHON python3,
# SERVERS "llamafleet-tiers llamafleet-no-tiers llama-server" (a subset to run fewer; the comparison at the end takes
# every server's report found in OUT, so servers run in separate calls into one OUT are compared).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:?usage: MODEL=FILE LLAMA_SERVER=BIN scripts/sessions-bench.sh OUT_DIR}
: "${MODEL:?set MODEL to a GGUF file}"
SESSIONS=${SESSIONS:-6} TURNS=${TURNS:-3} PRIVATE=${PRIVATE:-870} SYSTEM=${SYSTEM:-0} CONC=${CONC:-2}
SLOTS=${SLOTS:-2} CTX=${CTX:-4096} MAX_TOKENS=${MAX_TOKENS:-32} CACHE_RAM=${CACHE_RAM:-2048} SEED=${SEED:-7}
DISK_MIB=${DISK_MIB:-20480} THREADS=${THREADS:-$(nproc)} DEVICE=${DEVICE:-cpu} PORT=${PORT:-18090}
FLEET_CACHE_RAM=${FLEET_CACHE_RAM:-$CACHE_RAM} BY_TURN=${BY_TURN:-1} PARK=${PARK:-0} KV=${KV:-f16}
order=(); [ "$BY_TURN" = 1 ] && order=(--by-turn)
[ -n "${DEADLINE:-}" ] && order+=(--deadline "$DEADLINE")
PY=${PYTHON:-python3}
SERVERS=${SERVERS:-llamafleet-tiers llamafleet-no-tiers llama-server}
mkdir -p "$OUT"
log() { printf '=== %s  %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$OUT/run.log"; }
. "$repo/scripts/serve-lib.sh"  # wait_ready, stop
replay() {  # label
  log "replay $1: $SESSIONS sessions x $TURNS turns, $PRIVATE private words each, $CONC at a time ${order[*]}; uptime: $(uptime)"
  "$PY" -m llamafleet.cli bench multiturn --url "http://127.0.0.1:$PORT" --conversations "$SESSIONS" \
    --turns "$TURNS" --system-tokens "$SYSTEM" --private-tokens "$PRIVATE" --concurrency "$CONC" "${order[@]}" \
    --max-tokens "$MAX_TOKENS" --seed "$SEED" --label "$1" --out "$OUT/$1" --no-progress >>"$OUT/bench.log" 2>&1 \
    || log "replay $1: some requests failed (see bench.log)"
  log "replay $1 done; uptime: $(uptime)"
}
fleet() {  # label, extra serve flags...
  local label=$1; shift
  log "llamafleet serve ($SLOTS slots x $CTX tokens) $*"
  "$PY" -m llamafleet.cli serve --model "$MODEL" --port "$PORT" --replicas 1 --parallel "$SLOTS" --ctx "$CTX" \
    --threads "$THREADS" "$@" >"$OUT/serve-$label.log" 2>&1 & pid=$!
  wait_ready "http://127.0.0.1:$PORT/ready" $pid || { tail -30 "$OUT/serve-$label.log"; exit 1; }
  replay "$label"
  curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^llamafleet_(prompt_tokens|kv_tier)' >"$OUT/$label-metrics.txt" || true
  stop $pid
}
has() { case " $SERVERS " in *" $1 "*) return 0;; esac; return 1; }

cd "$repo"
log "model $MODEL on $DEVICE; $(nproc) cores; uptime: $(uptime)"
if has llamafleet-tiers; then
  rm -rf "$OUT/kv-cache"
  printf 'cache_disk_mib: %s\nkv_cache_type: %s\n' "$DISK_MIB" "$KV" >"$OUT/tiers.yaml"
  fleet llamafleet-tiers --config "$OUT/tiers.yaml" --cache-ram "$FLEET_CACHE_RAM" --cache-dir "$OUT/kv-cache" \
    --cache-park "$PARK"
fi
printf 'kv_cache_type: %s\n' "$KV" >"$OUT/no-tiers.yaml"
has llamafleet-no-tiers && fleet llamafleet-no-tiers --config "$OUT/no-tiers.yaml" --cache-ram 0
if has llama-server; then
  : "${LLAMA_SERVER:?set LLAMA_SERVER to a llama-server binary}"
  gpu=(); [ "$DEVICE" = gpu ] && gpu=(-ngl 99 -fa on)
  log "llama-server -np $SLOTS -c $((SLOTS * CTX)) --cache-ram $CACHE_RAM"
  "$LLAMA_SERVER" -m "$MODEL" --port "$PORT" -np "$SLOTS" -c $((SLOTS * CTX)) --cache-ram "$CACHE_RAM" \
    -ctk "$KV" -ctv "$KV" -t "$THREADS" "${gpu[@]}" --no-webui >"$OUT/serve-llama-server.log" 2>&1 & pid=$!
  wait_ready "http://127.0.0.1:$PORT/health" $pid || { tail -30 "$OUT/serve-llama-server.log"; exit 1; }
  replay llama-server
  stop $pid
fi
reports=()
# every server's report in OUT, this call's or an earlier call's (one call per server where each takes minutes)
for s in llamafleet-tiers llamafleet-no-tiers llama-server; do
  [ -f "$OUT/$s/bench.json" ] && reports+=("$OUT/$s/bench.json")
done
[ "${#reports[@]}" -ge 2 ] && "$PY" -m llamafleet.cli bench --compare "${reports[@]}" --out "$OUT/compare" | tee -a "$OUT/run.log"
log "done; uptime: $(uptime)"
