# Shell functions the benchmark scripts share (sourced by gpu-bench.sh, spec-bench.sh and sessions-bench.sh): waiting
# for a server and stopping it.

wait_ready() {  # readiness url (llamafleet: /ready, 200 once every replica is up; llama-server: /health), pid
  for _ in $(seq 1 600); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}

stop() {  # pid: SIGINT (a drain), then SIGKILL after 60 s
  kill -INT "$1" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$1" 2>/dev/null || return 0; sleep 1; done
  kill -9 "$1" 2>/dev/null || true
}
