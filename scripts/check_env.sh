#!/usr/bin/env bash
# First look at a new machine, before anything is installed: NVIDIA driver and GPUs, /dev/nvidia* devices,
# CUDA_VISIBLE_DEVICES, CPU flags, RAM, disk and the Python version. Needs only bash and coreutils. Once llamafleet
# is installed (./.venv or PATH) it runs `llamafleet check-env` with the same arguments instead, which checks all of
# that and more (llama.cpp build, CUDA versions, interconnect, model size), so that each check is said once; the
# shell's own checks run again only if check-env itself cannot run.
#
# Usage: scripts/check_env.sh [--cpu-only] [--model FILE | --config fleet.yaml] [--json]
# Exit code: 0 ok, 1 warnings, 2 failures (`llamafleet check-env`'s, or the shell checks' before it is installed).
# With --json the lines of this script go to stderr, so stdout stays one JSON document.
set -uo pipefail
cd "$(dirname "$0")/.."

CPU_ONLY=0
JSON=0
for arg in "$@"; do
  case "$arg" in
    --cpu-only) CPU_ONLY=1 ;;
    --json) JSON=1 ;;
  esac
done

RC=0
report() {  # report STATUS NAME DETAIL [FIX]
  local line
  line=$(printf '%-4s  %-10s %s' "$1" "$2" "$3")
  if [ -n "${4:-}" ] && { [ "$1" = WARN ] || [ "$1" = FAIL ]; }; then line="$line  -> fix: $4"; fi
  if [ "$JSON" = 1 ]; then echo "$line" >&2; else echo "$line"; fi
  case "$1" in
    WARN) [ "$RC" -lt 1 ] && RC=1 ;;
    FAIL) RC=2 ;;
  esac
}

# --- Is llamafleet installed? (decides whether the AMX note is a warning; see the cpu section)
LLAMAFLEET=""
if [ -x .venv/bin/llamafleet ]; then
  LLAMAFLEET=.venv/bin/llamafleet
elif command -v llamafleet >/dev/null 2>&1; then
  LLAMAFLEET=$(command -v llamafleet)
fi

shell_checks() {
  # --- NVIDIA driver and GPUs
  shopt -s nullglob
  DEVICES=(/dev/nvidia[0-9]*)
  shopt -u nullglob
  NGPU=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    if GPUS=$(nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv,noheader,nounits 2>&1); then
      NGPU=$(printf '%s\n' "$GPUS" | grep -c .)
      DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)
      CUDA=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | grep -o '[0-9.]*$')
      report PASS driver "NVIDIA driver ${DRIVER:-?}, supports CUDA ${CUDA:-?}; $NGPU GPU(s)"
      LIST=$(printf '%s\n' "$GPUS" | awk -F', ' '{printf "%sGPU %s %s: %s of %s MiB free", (NR>1?"; ":""), $1, $2, $4, $3}')
      report PASS gpus "$LIST"
    else
      report FAIL driver "nvidia-smi fails: $(printf '%s\n' "$GPUS" | head -n1)" \
        "after a driver update reboot (or reload the nvidia module); in a container start it with --gpus all"
    fi
  elif [ "${#DEVICES[@]}" -gt 0 ]; then
    report FAIL driver "${#DEVICES[@]} /dev/nvidia* device(s) but no nvidia-smi" \
      "install the NVIDIA user-space driver (nvidia-utils) matching the kernel module"
  elif [ "$CPU_ONLY" = 1 ]; then
    report PASS driver "no NVIDIA GPU (--cpu-only: as intended); llamafleet will serve on the CPU"
  else
    report WARN driver "no NVIDIA GPU: no nvidia-smi, no /dev/nvidia* devices; llamafleet will serve on the CPU" \
      "on a CPU-only machine pass --cpu-only; on a GPU machine install the NVIDIA driver; in a container start it with --gpus all"
  fi

  # --- Device files against the GPUs, and what CUDA_VISIBLE_DEVICES leaves visible
  if [ "$NGPU" -gt 0 ]; then
    BAD=""
    for d in "${DEVICES[@]}"; do
      { [ -r "$d" ] && [ -w "$d" ]; } || BAD="$BAD $d"
    done
    if [ "${#DEVICES[@]}" -eq 0 ]; then
      report FAIL devices "no /dev/nvidia[0-9] device files: CUDA cannot open any GPU" \
        "in a container start it with --gpus all"
    elif [ -n "$BAD" ]; then
      report FAIL devices "this user may not open:$BAD" "add the user to the group owning the devices (often video or render)"
    elif [ "${CUDA_VISIBLE_DEVICES+set}" = set ] && [ -z "${CUDA_VISIBLE_DEVICES// /}" ]; then
      report FAIL devices "CUDA_VISIBLE_DEVICES is empty: it hides every GPU" \
        "unset CUDA_VISIBLE_DEVICES (llamafleet gives each worker its own GPUs)"
    elif [ "${CUDA_VISIBLE_DEVICES+set}" = set ]; then
      report WARN devices "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES limits which of the $NGPU GPU(s) are used" \
        "unset CUDA_VISIBLE_DEVICES unless you mean to hide GPUs"
    else
      report PASS devices "${#DEVICES[@]} device file(s) for $NGPU GPU(s), all usable"
    fi
  fi

  # --- CPU flags (x86-64): the portable llama.cpp build needs AVX2, FMA, F16C (and BMI2); AMX is the SIGILL trap
  FLAGS=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2-)
  if [ -z "$FLAGS" ]; then
    report SKIP cpu "no x86 CPU flags in /proc/cpuinfo ($(uname -m))"
  else
    MISSING=""
    for f in avx2 fma f16c bmi2; do
      [[ " $FLAGS " == *" $f "* ]] || MISSING="$MISSING $f"
    done
    if [ -n "$MISSING" ]; then
      report FAIL cpu "the CPU lacks$MISSING, needed by the portable llama.cpp build" \
        "build for this CPU: LLAMAFLEET_BACKEND=native scripts/install.sh"
    elif [[ " $FLAGS " == *" amx_tile "* ]] && [ -z "$LLAMAFLEET" ]; then
      report WARN cpu "AVX2/FMA/F16C present; the CPU advertises AMX: a -march=native build dies with SIGILL where the hypervisor does not grant it" \
        "keep the portable build (scripts/install.sh default, or LLAMAFLEET_BACKEND=cuda); never LLAMAFLEET_BACKEND=native"
    else
      report PASS cpu "AVX2, FMA, F16C, BMI2 present ($(nproc) cores)"
    fi
  fi

  # --- RAM and disk (the cache holds fetched models and built wheels)
  AVAIL_KB=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null)
  TOTAL_KB=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null)
  if [ -n "$AVAIL_KB" ]; then
    report PASS ram "$((AVAIL_KB / 1048576)) GiB of $((TOTAL_KB / 1048576)) GiB available"
  else
    report SKIP ram "no /proc/meminfo"
  fi
  CACHE=${LLAMAFLEET_CACHE:-${XDG_CACHE_HOME:-${HOME:-/}/.cache}/llamafleet}
  PROBE=$CACHE
  while [ ! -d "$PROBE" ]; do PROBE=$(dirname "$PROBE"); done
  FREE_KB=$(df -Pk "$PROBE" 2>/dev/null | awk 'NR==2 {print $4}')
  DISK_FIX="free space, or point LLAMAFLEET_CACHE at a larger disk"
  if [ -z "$FREE_KB" ]; then
    report SKIP disk "cannot measure free space for $CACHE"
  elif [ "$FREE_KB" -lt 262144 ]; then
    report FAIL disk "$((FREE_KB / 1024)) MiB free for the llamafleet cache ($CACHE)" "$DISK_FIX"
  elif [ "$FREE_KB" -lt 2097152 ]; then
    report WARN disk "$((FREE_KB / 1024)) MiB free for the llamafleet cache ($CACHE): under 2 GiB" "$DISK_FIX"
  else
    report PASS disk "$((FREE_KB / 1048576)) GiB free for the llamafleet cache ($CACHE)"
  fi

  # --- Python
  PY=${PYTHON:-python3}
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
  if PYV=$("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3]); sys.exit(sys.version_info < (3, 11))' 2>/dev/null); then
    report PASS python "Python $PYV ($PY)"
  elif [ -n "$PYV" ]; then
    report FAIL python "Python $PYV ($PY); llamafleet needs 3.11 or newer" "install Python 3.11+, then PYTHON=python3.11 scripts/install.sh"
  else
    report FAIL python "no $PY interpreter found" "install Python 3.11+"
  fi
}

# --- The full judgement, or the shell's own checks before llamafleet is installed
if [ -n "$LLAMAFLEET" ]; then
  [ "$JSON" = 1 ] || echo "== llamafleet check-env"
  "$LLAMAFLEET" check-env "$@"
  PRC=$?
  if [ "$PRC" -le 2 ]; then exit "$PRC"; fi
  echo "check_env.sh: \`llamafleet check-env\` could not run (exit $PRC); the shell's own checks follow" >&2
  LLAMAFLEET=""
fi
shell_checks
report SKIP llamafleet "not installed yet (or broken): run scripts/install.sh, then scripts/check_env.sh again"
exit "$RC"
