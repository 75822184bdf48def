#!/usr/bin/env bash
# Install llamafleet into ./.venv, idempotently.
#
# llama-cpp-python ships as an sdist, so pip compiles llama.cpp. pip's own wheel cache does not key on CMAKE_ARGS,
# and its default build uses -march=native (a wheel built on one CPU can die with SIGILL on another, e.g. AMX
# advertised by the CPU but not granted by the hypervisor). So this script builds the wheel itself into a cache
# folder keyed by version + build flags, and reuses it whenever nothing changed.
#
# Environment:
#   LLAMAFLEET_BACKEND   cpu (default: portable x86-64 AVX2 build) | native (this host's best CPU features)
#                        | cuda (GPU offload; CUDA_ARCHITECTURES picks the SM list, default "native")
#   LLAMA_CPP_SOURCE     a llama-cpp-python source tree or sdist to build from (for machines without PyPI)
#   LLAMAFLEET_EXTRAS    pip extras for llamafleet itself (default "dev": test and lint tools)
#   PYTHON               the interpreter for the venv (>= 3.11; default python3)
set -euo pipefail
cd "$(dirname "$0")/.."

# the pin is written once, in pyproject.toml
LLAMA_CPP_VERSION=$(sed -n 's/^ *"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
[ -n "$LLAMA_CPP_VERSION" ] || { echo "install.sh: no \"llama-cpp-python==VERSION\" line in pyproject.toml" >&2; exit 2; }
BACKEND=${LLAMAFLEET_BACKEND:-cpu}
PORTABLE="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
case "$BACKEND" in
  cpu)    FLAGS="$PORTABLE" ;;
  native) FLAGS="-DGGML_NATIVE=ON" ;;
  cuda)   FLAGS="$PORTABLE -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-native}" ;;
  *) echo "install.sh: LLAMAFLEET_BACKEND must be cpu, native or cuda (got '$BACKEND')" >&2; exit 2 ;;
esac
# The RPC backend (one model across hosts, `llamafleet rpc-server`; docs/DEPLOYMENT.md) adds one source file.
# The multimodal (llava/mtmd) library is not used by llamafleet; skipping it saves minutes of compile time.
FLAGS="$FLAGS -DGGML_RPC=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF"

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $($PY --version), then upgrading pip in it"
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
VPY=.venv/bin/python

key=$(printf '%s|%s|%s' "$LLAMA_CPP_VERSION" "$FLAGS" "${LLAMA_CPP_SOURCE:-pypi}" | sha256sum | cut -c1-16)
stamp=.venv/.llama-cpp-build-$key
if [ -f "$stamp" ]; then
  echo "==> llama-cpp-python $LLAMA_CPP_VERSION ($BACKEND) already installed"
else
  cache=${LLAMAFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llamafleet}/wheels/$key
  wheel=$(ls "$cache"/llama_cpp_python-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    echo "==> building llama-cpp-python $LLAMA_CPP_VERSION ($BACKEND build), once; later installs reuse it"
    echo "    flags: $FLAGS"
    mkdir -p "$cache"
    src=${LLAMA_CPP_SOURCE:-}
    if [ -z "$src" ]; then
      # Keep the sdist: it is also where `llamafleet synth` finds the real LLaMA-2 tokenizer (vocab GGUF).
      sdist_dir=${LLAMAFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llamafleet}/sdist
      src=$sdist_dir/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz
      if [ ! -f "$src" ]; then
        echo "==> downloading the llama-cpp-python $LLAMA_CPP_VERSION source (about 77 MB, with llama.cpp inside)"
        echo "    from PyPI into $sdist_dir"
        mkdir -p "$sdist_dir"
        $VPY -m pip download --no-deps --no-binary :all: -d "$sdist_dir" "llama-cpp-python==$LLAMA_CPP_VERSION"
      fi
    fi
    echo "==> compiling llama.cpp: about 13 minutes on 2 cores (less with more); pip shows only a spinner meanwhile"
    CMAKE_ARGS="$FLAGS" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      $VPY -m pip wheel --no-deps --no-binary llama-cpp-python --no-cache-dir -w "$cache" "$src"
    wheel=$(ls "$cache"/llama_cpp_python-*.whl | head -n1)
  else
    echo "==> reusing cached build $wheel"
  fi
  # replace the package itself (its build flags may differ), then let pip add whatever it depends on
  $VPY -m pip install -q --force-reinstall --no-deps "$wheel"
  $VPY -m pip install -q "$wheel"
  rm -f .venv/.llama-cpp-build-*
  touch "$stamp"
fi

# The dashboard's browser test (tests/integration/test_dashboard.py) drives Debian's Chromium; the dev extras install
# it once (apt keeps the packages; nothing happens when it is there). Without root or apt the test will fail, saying so.
CHROMIUM=${LLAMAFLEET_CHROMIUM:-/usr/bin/chromium}
if [[ ",${LLAMAFLEET_EXTRAS:-dev}," == *,dev,* ]] && [ ! -x "$CHROMIUM" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "==> installing Chromium (Debian's package, about 100 MB) for the dashboard's browser test, once"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; then
      echo "install.sh: warning: apt-get could not install chromium; the dashboard's browser test will fail" >&2
    fi
  else
    echo "install.sh: warning: $CHROMIUM is missing; the dashboard's browser test needs it:" \
         "sudo apt-get install chromium (or set LLAMAFLEET_CHROMIUM)" >&2
  fi
fi

echo "==> installing llamafleet and its Python dependencies (FastAPI, numpy, matplotlib, ...; pip runs quietly:"
echo "    a minute or two of downloads the first time, seconds once they are installed)"
$VPY -m pip install -q -e ".[${LLAMAFLEET_EXTRAS:-dev}]"
echo "==> done: run .venv/bin/llamafleet (or 'source .venv/bin/activate', then llamafleet)"
