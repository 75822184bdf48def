#!/usr/bin/env bash
# GPU benchmark: llamafleet against llama.cpp's own tools, built from the same source, measured in one run.
#
#   scripts/gpu-bench.sh [PHASE ...]
#
# Phases (default: all that the machine's GPU count allows, in this order):
#   build        compile llama.cpp (CUDA, shared libs) from the llama-cpp-python source: libllama for llamafleet and
#                llama-bench, llama-batched-bench, llama-server for the comparison, one build for both
#   models       synthesize LLaMA-2-shaped GGUF files with random weights (llamafleet synth)
#   llama        llama-bench (pp512, tg128) and llama-batched-bench (128 prompt + 128 answer, 1..128 sequences)
#   policy       prefill policies in-process (scripts/wave_probe.py): closed-loop streams, TTFT / ITL / tok/s each
#   engine       llamafleet's engine in-process: 1 and 128 concurrent requests; decode overlapped with the text work
#                (default), one pass at a time (--no-overlap), and sampling in llama.cpp's graph (--backend-sampling)
#   serve        HTTP, one GPU: llamafleet serve vs llama-server, same slots and context, concurrency 1..128
#   multiturn    HTTP, one GPU: 32 conversations x 4 turns sharing a 1300-token system prompt (bench multiturn),
#                llamafleet vs llama-server with its prompt cache on: TTFT per turn, wall time, cache hit rate
#   sessions     HTTP, one GPU: sessions that outnumber the slots (scripts/sessions-bench.sh): SESSIONS_N (64)
#                conversations x 4 turns, each with SESSIONS_PRIVATE (8192) private words, SESSIONS_CONC (32) turns
#                in flight on 16 slots, on SESSIONS_SHAPE (default llama3-8b: Llama-3-8B's shape as Q4_0 with its
#                llama-bpe tokenizer, trained on 32k tokens by synth --ctx-train so that llama-server allows 8k
#                slots; or llama2-7b); llama-server with --cache-ram SESSIONS_RAM (8192 MiB), llamafleet with a RAM
#                tier of SESSIONS_FLEET_RAM (65536 MiB), a disk tier of SESSIONS_DISK_MIB (40960) under $WORK and
#                SESSIONS_PARK sessions parked in VRAM (--cache-park), and without tiers; SERVERS (passed through)
#                picks the servers (default "llamafleet-tiers llama-server"), one 10-minute call per server; a
#                replay sends no turn after SESSIONS_DEADLINE seconds (default 420: the rest are reported as not
#                sent, so a slow server's side still ends inside its call with the turns it made).
#                llama3-8b (grouped-query attention: 1 GiB of f16 KV per 8k session; a pruned source tree must keep
#                models/ggml-vocab-llama-bpe.gguf and templates/): SESSIONS_PARK 64 (16 slots and
#                65 parked sequences, ~89 GiB of KV on an H200) holds every session, so the turns go turn by turn
#                over all 64 sessions (SESSIONS_BY_TURN 1: 63 other sessions between two turns of one).
#                llama2-7b (4.4 GiB per 8k session): SESSIONS_PARK 10, each of the SESSIONS_CONC conversations runs
#                its turns back to back (SESSIONS_BY_TURN 0); 16 slots + 11 parked sequences leave ~15 GiB of an
#                H200: enough for SESSIONS_CONC=24; with SESSIONS_KV=q8_0, SESSIONS_PARK=20 fits and covers 32.
#                Not in the default phases (llama-server's side alone takes most of a 10-minute call)
#   fleet        several models on one GPU in a budget that cannot hold them all (scripts/fleet_probe.py): loads
#                on demand, evictions, planned vs measured memory, /v1/embeddings alone and beside chats
#   multi        (2+ GPUs) one llamafleet endpoint over one replica per GPU, against the one-GPU run
#   split        (2+ GPUs) 70B Q4_0: tensor split vs layer split, single stream and 32 streams
#   consistency  (2+ GPUs) greedy agreement of batched / layer / tensor against a one-at-a-time reference
#   spec         (not in the default list: it needs a real model, SPEC_MODEL, default the demo model) speculative
#                decoding by scripts/spec-bench.sh on GPU 0: verification passes of 1-17 tokens and the edit
#                answers replayed (scripts/spec_probe.py), prompt lookup on and off in-process (1 and 128
#                streams, edit / extract / random) and over HTTP (edit workload, SPEC_LEVELS, default 1,8,128),
#                against llama-server's n-gram speculation (SERVER_SPEC, default ngram-simple ngram-mod) with the
#                same lookup and draft lengths; SPEC_PHASES (probe engine http), REPEAT (in-process off/on pairs, in
#                alternating order), HTTP_REPEAT (fresh llamafleet servers off/on, alternating) and ENGINE_WORKLOADS
#                pass through; DRAFT_MODEL or DRAFT_QUANT (passed through) add a draft model's in-process phases
#   torch        (not in the default list: it needs transformers, tokenizers and safetensors beside torch; run it
#                after build) the torch engine on GPU 0: LLaMA-2 7B's shape as a checkpoint folder (random fp16
#                safetensors, written here) against the GGUF engine on F16 and Q8_0 files of the same shape, each
#                served alone (32 slots, ctx CTX), 1 and 32 streams over HTTP; /v1/status (planned vs measured
#                memory, graph_steps) and the serve log's lines on CUDA graphs (graphs-LABEL.txt) saved per run.
#                TORCH_RUNS picks the runs, in order (default "torch-f16 gguf-f16 engine-torch"): torch-f16 (decode
#                steps as CUDA graphs, the default), torch-f16-eager (--cuda-graphs off), gguf-f16, gguf-q8_0 (HTTP),
#                engine-torch (in-process `bench engine`, 32 requests x 128 tokens, graphs then eager, side by side)
#   rerank       (not in the default list) /v1/rerank of 64 documents x 200 tokens on the host's CPU (GPUs hidden),
#                llamafleet against the llama-server of the build phase (scripts/rerank-bench.sh), rounds interleaved
#
# Environment:
#   SRC                 llama-cpp-python source tree or sdist (default: the one scripts/install.sh cached)
#   WORK                scratch folder for the build and the models (default: .gpu-work)
#   REPORT              output folder for logs, JSON and report.md (default: $WORK/report)
#   CUDA_ARCHITECTURES  default: native
#   PYTHON              interpreter with llamafleet's dependencies (default: python3)
#   QUICK=1             fewer requests per level (a smoke run); REQS=N sets the requests per level (default: the
#                       bench's own, 4 x concurrency and at least 16)
#   SKIP_LLAMA_SERVER=1 the serve and multiturn phases measure llamafleet only; LEVELS=1,8,32 picks the serve
#                       phase's concurrency levels; BATCHES="2048 512:512" runs llamafleet once per entry B[:P]
#                       (batch_size B, the tokens one step may take; prefill_tokens P, the prompt tokens among them,
#                       default 512; 512:512 is the rule before run 9), labelled -b<B>[-<P>] when more than one;
#                       POLICIES="B:P ..." (P - = what running answers leave of B) and POLICY_STREAMS="32 128"
#                       choose the policy phase's runs
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$repo/.gpu-work}
REPORT=${REPORT:-$WORK/report}
PY=${PYTHON:-python3}
mkdir -p "$WORK" "$REPORT"
log() { printf '\n=== %s  %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$REPORT/run.log"; }

# --- source ------------------------------------------------------------------------------------------------------
LLAMA_CPP_VERSION=$(sed -n 's/^ *"llama-cpp-python==\([^"]*\)".*/\1/p' "$repo/pyproject.toml")  # the pin, written once
SRC=${SRC:-${LLAMAFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llamafleet}/sdist/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz}
if [ -f "$SRC" ]; then
  if [ ! -d "$WORK/src" ]; then mkdir -p "$WORK/src" && tar xzf "$SRC" -C "$WORK/src" --strip-components=1; fi
  SRC=$WORK/src
fi
[ -d "$SRC/vendor/llama.cpp" ] || { echo "gpu-bench: no llama.cpp source under $SRC (set SRC)" >&2; exit 2; }
BUILD=$WORK/build
BIN=$BUILD/bin
export PYTHONPATH="$SRC:$repo/src${PYTHONPATH:+:$PYTHONPATH}"

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$NGPU" -gt 0 ] || { echo "gpu-bench: no NVIDIA GPU visible (nvidia-smi -L)" >&2; exit 2; }
if [ "$#" -gt 0 ]; then PHASES="$*"; else
  PHASES="build models llama engine serve multiturn"
  [ "$NGPU" -ge 2 ] && PHASES="$PHASES multi split consistency"
fi
has() { case " $PHASES " in *" $1 "*) return 0;; esac; return 1; }
if [ -n "${REQS:-}" ]; then REQ_ARGS=(--requests "$REQS"); elif [ "${QUICK:-0}" = 1 ]; then REQ_ARGS=(--requests 16)
else REQ_ARGS=(); fi

M7=$WORK/models/llama2-7b-q4_0.gguf
M70=$WORK/models/llama2-70b-q4_0.gguf
SLOTS=128
CTX=1024          # per sequence: 128-token prompt + 128-token answer fits with room
PORT=18080

# --- build -------------------------------------------------------------------------------------------------------
if has build; then
  log "build llama.cpp with CUDA (${CUDA_ARCHITECTURES:-native}) from $SRC"
  cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-native}" -DGGML_NATIVE=OFF -DGGML_AVX2=ON \
    -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$REPORT/cmake.log" 2>&1
  cmake --build "$BUILD" -j "$(nproc)" --target llama llama-bench llama-batched-bench llama-server \
    >"$REPORT/build.log" 2>&1 || { tail -40 "$REPORT/build.log"; exit 1; }
  # the llama_cpp Python package of the same source loads these very files (a link, not copies: two copies of
  # libggml in one process would mean two backend registries)
  rm -rf "$SRC/llama_cpp/lib" && ln -s "$BIN" "$SRC/llama_cpp/lib"
  "$PY" -c "import llamafleet.engine.llama_backend as L; assert L.supports_gpu_offload(), 'no GPU offload'; print(L.system_info())" \
    | tee -a "$REPORT/run.log"
fi

# --- models ------------------------------------------------------------------------------------------------------
if has models; then
  mkdir -p "$WORK/models"
  vocab=$SRC/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf
  synth() { "$PY" -m llamafleet.cli synth --shape "$1" --quant q4_0 --vocab "$vocab" -q -o "$2"; }
  [ -f "$M7" ] || { log "synth 7B Q4_0"; synth llama2-7b "$M7"; }
  if has split && [ ! -f "$M70" ]; then log "synth 70B Q4_0"; synth llama2-70b "$M70"; fi
fi

# --- llama.cpp's own numbers ---------------------------------------------------------------------------------------
if has llama; then
  log "llama-bench 7B Q4_0 (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 "$BIN/llama-bench" -m "$M7" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o json \
    >"$REPORT/llama-bench.json" 2>"$REPORT/llama-bench.log"
  log "llama-batched-bench 7B Q4_0 (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 "$BIN/llama-batched-bench" -m "$M7" -ngl 99 -fa on -c $((SLOTS * 256 + 512)) -b 2048 \
    -ub 512 -npp 128 -ntg 128 -npl 1,8,32,64,128 --output-format jsonl \
    >"$REPORT/batched-bench.jsonl" 2>"$REPORT/batched-bench.log"
fi

# --- engine in-process ---------------------------------------------------------------------------------------------
if has engine; then
  for variant in overlap serial backend; do
    for n in 1 128; do
      log "engine in-process: $n requests x 128 tokens, $variant"
      case $variant in serial) extra=(--no-overlap);; backend) extra=(--backend-sampling);; *) extra=();; esac
      CUDA_VISIBLE_DEVICES=0 "$PY" -m llamafleet.cli bench engine --model "$M7" --requests "$n" --max-tokens 128 \
        "${extra[@]}" --json >"$REPORT/engine-$n-$variant.json" 2>>"$REPORT/engine.log"
    done
  done
  log "decode probe: 128 sequences through the bindings alone"
  CUDA_VISIBLE_DEVICES=0 "$PY" "$repo/scripts/decode_probe.py" "$M7" >"$REPORT/decode-probe.txt" 2>>"$REPORT/engine.log" \
    || log "decode probe failed (see engine.log)"
fi

# --- prefill policies in-process -----------------------------------------------------------------------------------
if has policy; then
  for n in ${POLICY_STREAMS:-128}; do
    log "prefill policies in-process: $n closed-loop streams, $((3 * n)) requests of 128 + 128 tokens"
    CUDA_VISIBLE_DEVICES=0 "$PY" "$repo/scripts/wave_probe.py" "$M7" "$n" $((3 * n)) \
      ${POLICIES:-2048:512 512:-} 2>>"$REPORT/policy.log" | tee -a "$REPORT/policy-$n.txt"
  done
fi

# --- HTTP, one GPU ------------------------------------------------------------------------------------------------
. "$repo/scripts/serve-lib.sh"  # wait_ready, stop
bench_http() {  # label, url, levels
  "$PY" -m llamafleet.cli bench --url "$2" --concurrency "$3" "${REQ_ARGS[@]}" --prompt-tokens 128 \
    --max-tokens 128 --label "$1" --out "$REPORT/$1" --no-progress >>"$REPORT/bench.log" 2>&1 \
    || echo "bench $1: some requests failed (see bench.log)" | tee -a "$REPORT/run.log"
}
dmon() { nvidia-smi dmon -s um -d 1 >"$REPORT/dmon-$1.log" 2>&1 & echo $!; }

BATCHES=${BATCHES:-2048}
if has serve; then
  for policy in $BATCHES; do
    IFS=: read -r b pf <<<"$policy"; yaml=$WORK/policy-${policy//:/-}.yaml
    label=llamafleet-1gpu; [ "$BATCHES" = "$policy" ] || label=llamafleet-1gpu-b${policy//:/-}
    log "llamafleet serve on GPU 0 ($SLOTS slots, ctx $CTX, batch $b, prefill ${pf:-512})"
    printf 'batch_size: %s\nprefill_tokens: %s\n' "$b" "${pf:-512}" >"$yaml"
    CUDA_VISIBLE_DEVICES=0 "$PY" -m llamafleet.cli serve --model "$M7" --config "$yaml" --port $PORT \
      --replicas 1 --parallel $SLOTS --ctx $CTX >"$REPORT/serve-$label.log" 2>&1 & pid=$!
    wait_ready "http://127.0.0.1:$PORT/ready" $pid || { tail -30 "$REPORT/serve-$label.log"; exit 1; }
    d=$(dmon $label); bench_http $label "http://127.0.0.1:$PORT" "${LEVELS:-1,8,32,64,128}"; kill $d
    stop $pid
  done
fi
if has serve && [ "${SKIP_LLAMA_SERVER:-0}" != 1 ]; then
  log "llama-server on GPU 0 (same slots and context)"
  CUDA_VISIBLE_DEVICES=0 "$BIN/llama-server" -m "$M7" --port $PORT -ngl 99 -fa on -np $SLOTS -c $((SLOTS * CTX)) \
    -b 2048 -ub 512 --no-webui --cache-ram 0 >"$REPORT/serve-llama-server.log" 2>&1 & pid=$!
  wait_ready "http://127.0.0.1:$PORT/health" $pid || { tail -30 "$REPORT/serve-llama-server.log"; exit 1; }
  d=$(dmon llama-server-1gpu); bench_http llama-server-1gpu "http://127.0.0.1:$PORT" "${LEVELS:-1,8,32,64,128}"; kill $d
  stop $pid
fi

# --- multi-turn replay, one GPU -----------------------------------------------------------------------------------
MT_SLOTS=64
MT_CTX=2048       # 1300-token system prompt + 4 turns of (25-token user line + 48-token answer) fits
replay() {  # label
  "$PY" -m llamafleet.cli bench multiturn --url "http://127.0.0.1:$PORT" --conversations 32 --turns 4 \
    --system-tokens 1300 --user-tokens 25 --max-tokens 48 --seed 7 --label "$1" --out "$REPORT/$1" --no-progress \
    >>"$REPORT/bench.log" 2>&1 || echo "replay $1: some requests failed (see bench.log)" | tee -a "$REPORT/run.log"
}
if has multiturn; then
  log "llamafleet serve on GPU 0 ($MT_SLOTS slots, ctx $MT_CTX): multi-turn replay"
  CUDA_VISIBLE_DEVICES=0 "$PY" -m llamafleet.cli serve --model "$M7" --port $PORT --replicas 1 --parallel $MT_SLOTS \
    --ctx $MT_CTX >"$REPORT/serve-llamafleet-multiturn.log" 2>&1 & pid=$!
  wait_ready "http://127.0.0.1:$PORT/ready" $pid || { tail -30 "$REPORT/serve-llamafleet-multiturn.log"; exit 1; }
  replay llamafleet-multiturn
  curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^llamafleet_prompt_tokens' >"$REPORT/multiturn-metrics.txt" || true
  stop $pid
fi
if has multiturn && [ "${SKIP_LLAMA_SERVER:-0}" != 1 ]; then
  log "llama-server on GPU 0 ($MT_SLOTS slots, prompt cache on, --cache-reuse 256): multi-turn replay"
  CUDA_VISIBLE_DEVICES=0 "$BIN/llama-server" -m "$M7" --port $PORT -ngl 99 -fa on -np $MT_SLOTS \
    -c $((MT_SLOTS * MT_CTX)) -b 2048 -ub 512 --no-webui --cache-reuse 256 >"$REPORT/serve-llama-server-multiturn.log" 2>&1 &
  pid=$!
  wait_ready "http://127.0.0.1:$PORT/health" $pid || { tail -30 "$REPORT/serve-llama-server-multiturn.log"; exit 1; }
  replay llama-server-multiturn
  stop $pid
fi
if has multiturn && [ -f "$REPORT/llamafleet-multiturn/bench.json" ] && [ -f "$REPORT/llama-server-multiturn/bench.json" ]; then
  "$PY" -m llamafleet.cli bench --compare "$REPORT/llamafleet-multiturn/bench.json" \
    "$REPORT/llama-server-multiturn/bench.json" --out "$REPORT/multiturn-compare" >>"$REPORT/bench.log" 2>&1 || true
fi

# --- speculative decoding, one GPU ---------------------------------------------------------------------------------
if has spec; then
  log "speculative decoding (scripts/spec-bench.sh) on GPU 0, model ${SPEC_MODEL:-the demo model}"
  CUDA_VISIBLE_DEVICES=0 MODEL=${SPEC_MODEL:-} LLAMA_SERVER=$BIN/llama-server REPORT=$REPORT/spec NGL=99 SLOTS=128 \
    CTX=2048 LEVELS=${SPEC_LEVELS:-1,8,128} ENGINE_STREAMS=128 MAX_TOKENS=256 PYTHON=$PY PORT=$PORT \
    bash "$repo/scripts/spec-bench.sh" || log "spec phase failed (see $REPORT/spec/run.log)"
fi

# --- reranking on the CPU -------------------------------------------------------------------------------------------
if has rerank; then
  log "rerank (scripts/rerank-bench.sh): 64 documents x 200 tokens on the CPU, llamafleet vs llama-server"
  CUDA_VISIBLE_DEVICES= LLAMA_SERVER=$BIN/llama-server PYTHON=$PY PORT=$PORT \
    bash "$repo/scripts/rerank-bench.sh" "$REPORT/rerank" || log "rerank phase failed (see $REPORT/rerank/run.log)"
fi

# --- sessions that outnumber the slots, one GPU ---------------------------------------------------------------------
if has sessions; then
  # llama-server caps a slot at the model's trained context: this model says it was trained on 32k tokens, so both
  # servers run 8k-token sessions (the 7B of the other phases says 4,096)
  shape=${SESSIONS_SHAPE:-llama3-8b}
  case $shape in
    llama3-8b) vocab=llama-bpe; template=meta-llama-Llama-3.1-8B-Instruct
      park=${SESSIONS_PARK:-${SESSIONS_N:-64}}; by_turn=${SESSIONS_BY_TURN:-1};;
    llama2-7b) vocab=llama-spm; template=; park=${SESSIONS_PARK:-10}; by_turn=${SESSIONS_BY_TURN:-0};;
    *) echo "gpu-bench: SESSIONS_SHAPE $shape: use llama3-8b or llama2-7b" >&2; exit 2;;
  esac
  ML=$WORK/models/$shape-q4_0-ctx32k.gguf
  [ -f "$ML" ] || { log "synth $shape Q4_0, trained context 32768"; "$PY" -m llamafleet.cli synth --shape $shape \
    --quant q4_0 --ctx-train 32768 --vocab "$SRC/vendor/llama.cpp/models/ggml-vocab-$vocab.gguf" -q -o "$ML" \
    ${template:+--chat-template "$SRC/vendor/llama.cpp/models/templates/$template.jinja"}; }
  log "sessions on $shape: ${SESSIONS_N:-64} x 4 turns, ${SESSIONS_PRIVATE:-8192} private words each, ${SESSIONS_CONC:-32} at a time (by turn: $by_turn), 16 slots, $park parked"
  CUDA_VISIBLE_DEVICES=0 MODEL=$ML LLAMA_SERVER=$BIN/llama-server DEVICE=gpu PYTHON=$PY PORT=$PORT \
    SESSIONS=${SESSIONS_N:-64} TURNS=4 PRIVATE=${SESSIONS_PRIVATE:-8192} CONC=${SESSIONS_CONC:-32} BY_TURN=$by_turn SLOTS=16 \
    CTX=$(( (${SESSIONS_PRIVATE:-8192} + 4 * (25 + 48) + 511) / 256 * 256 )) MAX_TOKENS=48 \
    CACHE_RAM=${SESSIONS_RAM:-8192} FLEET_CACHE_RAM=${SESSIONS_FLEET_RAM:-65536} DISK_MIB=${SESSIONS_DISK_MIB:-40960} \
    PARK=$park KV=${SESSIONS_KV:-f16} SERVERS=${SERVERS:-llamafleet-tiers llama-server} DEADLINE=${SESSIONS_DEADLINE:-420} \
    "$repo/scripts/sessions-bench.sh" "$REPORT/sessions" || log "sessions phase failed (see $REPORT/sessions/run.log)"
fi

# --- several models on one GPU, in a budget that does not hold them all -------------------------------------------
if has fleet; then
  M13=$WORK/models/llama2-13b-q4_0.gguf
  M7Q8=$WORK/models/llama2-7b-q8_0.gguf
  vocab=$SRC/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf
  [ -f "$M13" ] || { log "synth 13B Q4_0"; "$PY" -m llamafleet.cli synth --shape llama2-13b --quant q4_0 --vocab "$vocab" -q -o "$M13"; }
  [ -f "$M7Q8" ] || { log "synth 7B Q8_0"; "$PY" -m llamafleet.cli synth --shape llama2-7b --quant q8_0 --vocab "$vocab" -q -o "$M7Q8"; }
  free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0)
  usable=${FLEET_USABLE_MIB:-20480}   # 7B + 13B fit together, any third model evicts one
  cat >"$WORK/fleet.yaml" <<YAML
vram_margin_mib: $((free - usable))
parallel: 4
context_length: 1024
models:
  - {name: m7, path: $M7, pinned: true}
  - {name: m13, path: $M13}
  - {name: m7q8, path: $M7Q8}
YAML
  log "several models on GPU 0 in ${usable} MiB: plan, loads on demand, evictions, embeddings"
  CUDA_VISIBLE_DEVICES=0 "$PY" -m llamafleet.cli plan --config "$WORK/fleet.yaml" >"$REPORT/fleet-plan.txt" 2>&1 || true
  CUDA_VISIBLE_DEVICES=0 "$PY" -m llamafleet.cli serve --config "$WORK/fleet.yaml" --port $PORT \
    >"$REPORT/serve-fleet.log" 2>&1 & pid=$!
  wait_ready "http://127.0.0.1:$PORT/ready" $pid || { tail -30 "$REPORT/serve-fleet.log"; exit 1; }
  "$PY" "$repo/scripts/fleet_probe.py" "http://127.0.0.1:$PORT" m7 m13 m7q8 | tee "$REPORT/fleet.md"
  stop $pid
fi

# --- the torch engine against the GGUF engine, one GPU ---------------------------------------------------------------
if has torch; then
  vocab=$SRC/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf
  HF7=$WORK/models/llama2-7b-hf
  TORCH_RUNS=${TORCH_RUNS:-torch-f16 gguf-f16 engine-torch}
  for q in f16 q8_0; do
    g=$WORK/models/llama2-7b-$q.gguf
    case " $TORCH_RUNS " in *" gguf-$q "*) [ -f "$g" ] || { log "synth 7B $q"
      "$PY" -m llamafleet.cli synth --shape llama2-7b --quant $q --vocab "$vocab" -q -o "$g"; };; esac
  done
  [ -f "$HF7/config.json" ] || { log "synth 7B fp16 checkpoint folder"; "$PY" -m llamafleet.cli synth --shape llama2-7b \
    --hf --quant f16 --vocab "$vocab" -o "$HF7" >>"$REPORT/run.log" 2>&1; }
  for label in $TORCH_RUNS; do
    case $label in
      torch-f16) path=$HF7; extra=();; torch-f16-eager) path=$HF7; extra=(--cuda-graphs off);;
      gguf-f16|gguf-q8_0) path=$WORK/models/llama2-7b-${label#gguf-}.gguf; extra=();;
      engine-torch)
        for graphs in auto off; do
          log "bench engine: torch 7B fp16 in-process, 32 requests x 128 tokens, cuda_graphs $graphs"
          CUDA_VISIBLE_DEVICES=0 "$PY" -m llamafleet.cli bench engine --model "$HF7" --requests 32 --max-tokens 128 \
            --cuda-graphs $graphs --json >"$REPORT/engine-torch-$graphs.json" 2>"$REPORT/engine-torch-$graphs.log" \
            || log "bench engine (cuda_graphs $graphs) failed (see engine-torch-$graphs.log)"
          grep -i "graph\|eager" "$REPORT/engine-torch-$graphs.log" | tee "$REPORT/graphs-engine-torch-$graphs.txt" || true
        done
        continue;;
      *) log "TORCH_RUNS: unknown run $label"; continue;;
    esac
    log "llamafleet serve $label on GPU 0 (32 slots, ctx $CTX)"
    CUDA_VISIBLE_DEVICES=0 "$PY" -m llamafleet.cli plan --model "$path" --parallel 32 --ctx $CTX \
      >"$REPORT/plan-$label.txt" 2>&1 || true
    CUDA_VISIBLE_DEVICES=0 "$PY" -m llamafleet.cli serve --model "$path" --port $PORT --replicas 1 --parallel 32 \
      --ctx $CTX "${extra[@]}" >"$REPORT/serve-$label.log" 2>&1 & pid=$!
    wait_ready "http://127.0.0.1:$PORT/ready" $pid || { tail -30 "$REPORT/serve-$label.log"; stop $pid; continue; }
    d=$(dmon $label); bench_http "$label" "http://127.0.0.1:$PORT" 1,32; kill $d
    curl -s "http://127.0.0.1:$PORT/v1/status" >"$REPORT/status-$label.json" || true
    stop $pid
    grep -i "cuda graph\|run eagerly" "$REPORT/serve-$label.log" | tee "$REPORT/graphs-$label.txt" || true
  done
fi

if has multi; then
  log "llamafleet serve, one replica per GPU ($NGPU GPUs)"
  "$PY" -m llamafleet.cli serve --model "$M7" --port $PORT --replicas "$NGPU" --parallel $SLOTS --ctx $CTX \
    >"$REPORT/serve-llamafleet-multi.log" 2>&1 & pid=$!
  wait_ready "http://127.0.0.1:$PORT/ready" $pid || { tail -30 "$REPORT/serve-llamafleet-multi.log"; exit 1; }
  d=$(dmon llamafleet-${NGPU}gpu); bench_http "llamafleet-${NGPU}gpu" "http://127.0.0.1:$PORT" "128,$((128 * NGPU))"; kill $d
  stop $pid
fi

if has split; then
  for mode in tensor layer; do
    log "70B Q4_0, $mode split over $NGPU GPUs"
    cfg=$WORK/split-$mode.yaml
    printf 'split_mode: %s\nreplicas: 1\nparallel: 32\ncontext_length: %s\n' "$mode" "$CTX" >"$cfg"
    "$PY" -m llamafleet.cli plan --model "$M70" --config "$cfg" >"$REPORT/plan-70b-$mode.txt" 2>&1 || true
    "$PY" -m llamafleet.cli serve --model "$M70" --config "$cfg" --port $PORT >"$REPORT/serve-70b-$mode.log" 2>&1 & pid=$!
    wait_ready "http://127.0.0.1:$PORT/ready" $pid || { tail -30 "$REPORT/serve-70b-$mode.log"; stop $pid; continue; }
    nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv >"$REPORT/mem-70b-$mode.csv"
    bench_http "llamafleet-70b-$mode" "http://127.0.0.1:$PORT" 1,32
    stop $pid
  done
fi

if has consistency; then
  log "consistency: reference vs batched / layer / tensor (7B Q4_0)"
  "$PY" -m llamafleet.cli consistency --model "$M7" --configs reference,batched,layer,tensor \
    --out "$REPORT/consistency" >"$REPORT/consistency.log" 2>&1 || true
fi

# --- report --------------------------------------------------------------------------------------------------------
log "report"
"$PY" "$repo/scripts/gpu_report.py" "$REPORT" | tee "$REPORT/report.md"
