#!/usr/bin/env bash
# Install llamafleet into ./.venv, idempotently: what serving needs, nothing more (no root, no apt). The test tools
# come with LLAMAFLEET_EXTRAS=dev; scripts/test.sh installs them and what its browser test needs.
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
#   LLAMAFLEET_EXTRAS    pip extras for llamafleet itself, comma-separated (default none: what serving needs;
#                        "dev": the test and lint tools, "ray": replicas on a Ray cluster, "torch": the torch
#                        engine for checkpoint folders; scripts/test.sh asks for all three)
#   PYTHON               the interpreter for the venv (>= 3.11; default python3)
#   TORCH_INDEX          with the torch extra on a cpu/native backend: the index of the CPU build of PyTorch
#                        (default https://download.pytorch.org/whl/cpu)
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
CACHE_DIR=${LLAMAFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llamafleet}  # the built wheels and the source
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
  cache=$CACHE_DIR/wheels/$key
  wheel=$(ls "$cache"/llama_cpp_python-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    echo "==> building llama-cpp-python $LLAMA_CPP_VERSION ($BACKEND build), once; later installs reuse it"
    echo "    flags: $FLAGS"
    mkdir -p "$cache"
    src=${LLAMA_CPP_SOURCE:-}
    if [ -z "$src" ]; then
      # Keep the sdist: it is also where `llamafleet synth` finds the real LLaMA-2 tokenizer (vocab GGUF).
      sdist_dir=$CACHE_DIR/sdist
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
  $VPY -m pip install -q --no-compile --force-reinstall --no-deps "$wheel"
  $VPY -m pip install -q --no-compile "$wheel"
  rm -f .venv/.llama-cpp-build-*
  touch "$stamp"
fi

EXTRAS=${LLAMAFLEET_EXTRAS:-}
# The torch extra: PyPI's default torch wheel carries CUDA's libraries (gigabytes). Off the cuda backend, take the CPU
# build first from PyTorch's CPU index (pip's find-links, if configured, are searched too); the extra's torch
# requirement is then met and pip leaves it alone. Once installed, nothing is downloaded again.
if [[ ",$EXTRAS," == *",torch,"* && "$BACKEND" != cuda ]] && ! $VPY -c "import importlib.util as u; exit(u.find_spec('torch') is None)"; then
  echo "==> installing the CPU build of PyTorch (about 200 MB) for the torch extra, from ${TORCH_INDEX:=https://download.pytorch.org/whl/cpu}"
  $VPY -m pip install -q --no-compile --retries 1 --index-url "$TORCH_INDEX" torch
fi
echo "==> installing llamafleet${EXTRAS:+ with the extras $EXTRAS} and its Python dependencies (FastAPI, numpy,"
echo "    matplotlib, ...; pip runs quietly: a minute or two of downloads the first time, seconds once installed)"
$VPY -m pip install -q --no-compile -e ".${EXTRAS:+[$EXTRAS]}"
# pip compiles what it installs on one core; compileall does it on all of them, and only what is missing or out of date
# (an install with nothing new: about 4 s on 2 cores). llamafleet's own modules are compiled too: an editable
# install leaves them to each process, which compiles them in memory at every start where PYTHONDONTWRITEBYTECODE is
# set (every replica of every server). As pip does, files that are not valid Python (templates, test data that some
# packages ship) are left as they are, silently.
echo "==> compiling the installed modules to bytecode, on $(nproc) core(s)"
$VPY -m compileall -qq -j 0 "$($VPY -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" src || true
echo "==> done: run .venv/bin/llamafleet (or 'source .venv/bin/activate', then llamafleet)"
