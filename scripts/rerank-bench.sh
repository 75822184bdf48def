#!/usr/bin/env bash
# Reranking side by side in one run: llamafleet and llama-server (built from the same llama.cpp source) serving the
# same reranker, one /v1/rerank call of DOCS documents of TOKENS tokens each, rounds interleaved
# (scripts/rerank_probe.py), the median ratio of wall times and the two servers' scores compared.
#
#   LLAMA_SERVER=BIN scripts/rerank-bench.sh [OUT_DIR]
#
# The model: a synthetic BERT reranker of MiniLM-L6's shape (6 layers, 384 wide, 1536 feed-forward, 512 positions;
# the shape of the common ms-marco-MiniLM-L-6 cross-encoder) with a classifier head, written here, unless MODEL names
# one (its documents are then the synthetic vocabulary's words all the same: give a model whose vocabulary has them
# as whole tokens, or expect the probe's token-count check to stop it).
# Environment: LLAMA_SERVER (required), MODEL, DOCS (64), TOKENS (200), ROUNDS (5), SLOTS (8), THREADS (default:
# every core but one, llamafleet's own default, given to both), PORT (18095; llama-server on PORT+1), PYTHON
# (python3). On a machine with GPUs, hide them (CUDA_VISIBLE_DEVICES=) to measure the CPU: gpu-bench.sh's rerank
# phase does.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
OUT=${1:-rerank-report}
DOCS=${DOCS:-64}; TOKENS=${TOKENS:-200}; ROUNDS=${ROUNDS:-5}; SLOTS=${SLOTS:-8}; PORT=${PORT:-18095}
THREADS=${THREADS:-$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))}
: "${LLAMA_SERVER:?set LLAMA_SERVER to a llama-server binary built from the same llama.cpp source}"
mkdir -p "$OUT"
MODEL=${MODEL:-$OUT/reranker-minilm-l6-shape.gguf}
[ -f "$MODEL" ] || "$PY" -c "import sys; from llamafleet.model.synth_bert import write_bert; from gguf import PoolingType
write_bert(sys.argv[1], n_layer=6, n_embd=384, n_head=12, n_ff=1536, n_ctx=512, pooling=PoolingType.RANK)" "$MODEL"
. "$repo/scripts/serve-lib.sh"  # wait_ready, stop
echo "uptime: $(uptime)" | tee "$OUT/run.log"

"$PY" -m llamafleet.cli serve --model "$MODEL" --port "$PORT" --replicas 1 --parallel "$SLOTS" --ctx 512 \
  --threads "$THREADS" >"$OUT/serve-llamafleet.log" 2>&1 & fleet=$!
"$LLAMA_SERVER" -m "$MODEL" --port $((PORT + 1)) --reranking -np "$SLOTS" -c $((SLOTS * 512)) -b $((SLOTS * 512)) \
  -ub $((SLOTS * 512)) -t "$THREADS" --no-webui >"$OUT/serve-llama-server.log" 2>&1 & server=$!
trap 'stop $fleet; stop $server' EXIT
wait_ready "http://127.0.0.1:$PORT/ready" $fleet || { tail -30 "$OUT/serve-llamafleet.log"; exit 1; }
wait_ready "http://127.0.0.1:$((PORT + 1))/health" $server || { tail -30 "$OUT/serve-llama-server.log"; exit 1; }
"$PY" "$repo/scripts/rerank_probe.py" --fleet "http://127.0.0.1:$PORT" --server "http://127.0.0.1:$((PORT + 1))" \
  --docs "$DOCS" --tokens "$TOKENS" --rounds "$ROUNDS" --out "$OUT/rerank.json" | tee -a "$OUT/run.log"
echo "uptime: $(uptime)" | tee -a "$OUT/run.log"
