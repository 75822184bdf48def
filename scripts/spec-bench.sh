#!/usr/bin/env bash
# Speculative decoding (prompt lookup), measured side by side in one run: llamafleet with it on and off, and
# llama-server's own n-gram speculation with the same settings. Runs on a CPU (the demo model) or, called by
# scripts/gpu-bench.sh's `spec` phase, on one GPU.
#
#   scripts/spec-bench.sh
#
# 1. bench engine, in-process: the edit, extract and random workloads, 1 and ENGINE_STREAMS requests at once, each
#    phase with speculation off and on in turn (the ratios are of runs made under the same load);
# 1b. with DRAFT_MODEL (a GGUF with MODEL's vocabulary) or DRAFT_QUANT (q4_0 or q8_0: MODEL quantized again, every
#    tensor, into $REPORT/draft-$DRAFT_QUANT.gguf), the same engine phases with a draft model (edit and random);
# 0. scripts/spec_probe.py: the cost of verification passes of 1..17 tokens on this machine (passes.json), and the
#    edit workload's answers replayed under prompt lookup and the engine's policy (replay.json);
# 2. HTTP, the edit workload at LEVELS (a different prompt for every request): llamafleet serve with speculation off,
#    then on, each a fresh server (HTTP_REPEAT rounds, default 1, the order alternating: off, on, then on, off ...;
#    rounds after the first are labelled -rN), then llama-server with each of SERVER_SPEC (its n-gram speculation types, no draft model: ngram-simple copies what followed the latest
#    earlier occurrence of the last NGRAM tokens; ngram-mod chains a hashed NGRAM-gram -> next-token table; both
#    draft up to DRAFT tokens), then llama-server without speculation.
#
# Environment: MODEL (default: the demo model, `llamafleet model`), DRAFT_MODEL or DRAFT_QUANT (see 1b), LLAMA_SERVER (the binary; unset: that part is
# skipped), REPORT (default spec-report), NGRAM (default 3), DRAFT (default 8), MAX_BATCH (llamafleet's
# speculative.max_batch, default 4), LEVELS (default 1,8), SLOTS (default 8), CTX (default 2048), MAX_TOKENS
# (default 192), ENGINE_STREAMS (default 8), ENGINE_WORKLOADS (default "edit extract random"), REPEAT (off/on pairs
# per engine phase, in alternating order, median ratio; default 3), HTTP_REPEAT (default 1), REQUESTS (per level;
# default: the bench's), THREADS (CPU threads, default: the
# servers' own), NGL (GPU layers, default 0 here; gpu-bench.sh sets 99), SERVER_SPEC (default "ngram-simple
# ngram-mod"), SPEC_PHASES (default "probe engine http"), PYTHON (default python3).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
REPORT=${REPORT:-spec-report}
NGRAM=${NGRAM:-3}; DRAFT=${DRAFT:-8}; MAX_BATCH=${MAX_BATCH:-4}
LEVELS=${LEVELS:-1,8}; SLOTS=${SLOTS:-8}; CTX=${CTX:-2048}; MAX_TOKENS=${MAX_TOKENS:-192}
ENGINE_STREAMS=${ENGINE_STREAMS:-8}; REPEAT=${REPEAT:-3}; NGL=${NGL:-0}; PORT=${PORT:-18090}
ENGINE_WORKLOADS=${ENGINE_WORKLOADS:-edit extract random}; HTTP_REPEAT=${HTTP_REPEAT:-1}
MODEL=${MODEL:-$("$PY" -m llamafleet.cli model path)}
mkdir -p "$REPORT"
log() { printf '\n=== %s  %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$REPORT/run.log"; }
threads=(); [ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")
requests=(); [ -n "${REQUESTS:-}" ] && requests=(--requests "$REQUESTS")
SERVER_SPEC=${SERVER_SPEC:-ngram-simple ngram-mod}; SPEC_PHASES=${SPEC_PHASES:-probe engine http}
has() { [[ " $SPEC_PHASES " == *" $1 "* ]]; }
server_spec() {  # llama-server's options for speculation of type $1 with this run's settings
  case $1 in
    ngram-simple) echo --spec-type ngram-simple --spec-ngram-simple-size-n "$NGRAM" --spec-ngram-simple-size-m "$DRAFT" ;;
    ngram-mod) echo --spec-type ngram-mod --spec-ngram-mod-n-match "$NGRAM" --spec-ngram-mod-n-min 1 \
      --spec-ngram-mod-n-max "$DRAFT" ;;
    off) ;;
    *) echo "spec-bench.sh: SERVER_SPEC has $1; known: ngram-simple ngram-mod" >&2; return 1 ;;
  esac
}
for mode in $SERVER_SPEC; do server_spec "$mode" >/dev/null || exit 2; done
log "model $MODEL; uptime: $(uptime)"

if has probe; then
  log "spec_probe: verification passes of 1..17 tokens, and the edit workload replayed"
  "$PY" "$repo/scripts/spec_probe.py" passes "$MODEL" "${threads[@]}" --ngl "$NGL" >"$REPORT/passes.json" \
    2>>"$REPORT/engine.log" || log "spec_probe passes failed (see engine.log)"
  "$PY" "$repo/scripts/spec_probe.py" replay "$MODEL" "${threads[@]}" --max-draft "$DRAFT" >"$REPORT/replay.json" \
    2>>"$REPORT/engine.log" || log "spec_probe replay failed (see engine.log)"
fi

if has engine; then
  for workload in $ENGINE_WORKLOADS; do
    for n in 1 "$ENGINE_STREAMS"; do
      log "bench engine: $workload, $n at once, speculation off and on (max_draft $DRAFT)"
      "$PY" -m llamafleet.cli bench engine --model "$MODEL" "${threads[@]}" --workload "$workload" --requests "$n" \
        --max-tokens "$MAX_TOKENS" --speculative ngram --max-draft "$DRAFT" --spec-max-batch "$MAX_BATCH" \
        --repeat "$REPEAT" --json >"$REPORT/engine-$workload-$n.json" 2>>"$REPORT/engine.log"
    done
  done
fi

DRAFT_MODEL=${DRAFT_MODEL:-}
if [ -z "$DRAFT_MODEL" ] && [ -n "${DRAFT_QUANT:-}" ]; then
  DRAFT_MODEL=$REPORT/draft-$DRAFT_QUANT.gguf
  log "draft model: $MODEL quantized again to $DRAFT_QUANT, every tensor: $DRAFT_MODEL"
  "$PY" -c 'import sys; from llamafleet.engine.llama_backend import quantize; quantize(*sys.argv[1:])' \
    "$MODEL" "$DRAFT_MODEL" "$DRAFT_QUANT" 2>>"$REPORT/engine.log"
fi
if [ -n "$DRAFT_MODEL" ] && has engine; then
  for workload in edit random; do
    for n in 1 "$ENGINE_STREAMS"; do
      log "bench engine: $workload, $n at once, draft model $(basename "$DRAFT_MODEL") off and on"
      "$PY" -m llamafleet.cli bench engine --model "$MODEL" "${threads[@]}" --workload "$workload" --requests "$n" \
        --max-tokens "$MAX_TOKENS" --speculative draft --draft-model "$DRAFT_MODEL" --max-draft "$DRAFT" \
        --spec-max-batch "$MAX_BATCH" --repeat "$REPEAT" --json >"$REPORT/engine-draft-$workload-$n.json" \
        2>>"$REPORT/engine.log"
    done
  done
fi

. "$repo/scripts/serve-lib.sh"  # wait_ready, stop
bench_edit() {  # label
  "$PY" -m llamafleet.cli bench --url "http://127.0.0.1:$PORT" --workload edit --concurrency "$LEVELS" \
    "${requests[@]}" --max-tokens "$MAX_TOKENS" --label "$1" --out "$REPORT/$1" --no-progress \
    >>"$REPORT/bench.log" 2>&1 || echo "bench $1: some requests failed (see bench.log)" | tee -a "$REPORT/run.log"
}

has http || { log "done: $REPORT"; exit 0; }
reports=()
for round in $(seq 1 "$HTTP_REPEAT"); do
  order="off ngram"; [ $((round % 2)) = 0 ] && order="ngram off"
  for mode in $order; do
    label=llamafleet-spec-$mode; [ "$round" = 1 ] || label=$label-r$round
    yaml=$REPORT/llamafleet-$mode.yaml
    printf 'speculative:\n  mode: %s\n  max_draft: %s\n  ngram_min: %s\n  ngram_max: %s\n  max_batch: %s\n' \
      "$mode" "$DRAFT" "$NGRAM" "$NGRAM" "$MAX_BATCH" >"$yaml"
    log "llamafleet serve, speculation $mode (round $round): edit workload at $LEVELS"
    # (no RAM tier, as llama-server below runs with --cache-ram 0: the tier's first copy of a finished answer's KV,
    # made to measure what a copy costs, would land in the next request's time to first token)
    "$PY" -m llamafleet.cli serve --model "$MODEL" --config "$yaml" --port "$PORT" --replicas 1 --parallel "$SLOTS" \
      --ctx "$CTX" --cache-ram 0 "${threads[@]}" >"$REPORT/serve-$label.log" 2>&1 & pid=$!
    wait_ready "http://127.0.0.1:$PORT/ready" $pid || { tail -30 "$REPORT/serve-$label.log"; exit 1; }
    bench_edit "$label"
    curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^llamafleet_draft' >"$REPORT/metrics-$label.txt" || true
    stop $pid
    reports+=("$REPORT/$label/bench.json")
  done
done

if [ -n "${LLAMA_SERVER:-}" ]; then
  for mode in $SERVER_SPEC off; do
    read -r -a spec <<<"$(server_spec "$mode")"
    log "llama-server, speculation $mode: edit workload at $LEVELS"
    "$LLAMA_SERVER" -m "$MODEL" --port "$PORT" -ngl "$NGL" -np "$SLOTS" -c $((SLOTS * CTX)) --no-webui \
      --cache-ram 0 "${threads[@]}" ${spec[@]+"${spec[@]}"} >"$REPORT/serve-llama-server-$mode.log" 2>&1 & pid=$!
    wait_ready "http://127.0.0.1:$PORT/health" $pid || { tail -30 "$REPORT/serve-llama-server-$mode.log"; exit 1; }
    bench_edit "llama-server-spec-$mode"
    stop $pid
  done
fi

if [ -n "${LLAMA_SERVER:-}" ]; then
  for mode in $SERVER_SPEC off; do reports+=("$REPORT/llama-server-spec-$mode/bench.json"); done
fi
"$PY" -m llamafleet.cli bench --compare "${reports[@]}" --out "$REPORT/compare" | tee -a "$REPORT/run.log"
log "done: $REPORT"
