"""The ggml backend, its devices and llama.cpp's RPC backend: process-wide facts and setup, no model.

What asks llama.cpp about this host (GPU offload, compiled features), routes its logs, lists devices (this host's,
or an RPC server's on another host), or serves this host's devices over RPC, without loading a model. Also the base
of every binding object that owns native memory. :mod:`llamafleet.engine.llama` (models, contexts, batches) and
:mod:`llamafleet.engine.llama_sampler` build on it; importing it loads libllama but not numpy.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import llama_cpp as lc

from llamafleet.engine import llama_log

# ---------------------------------------------------------------------------------------------------------------
# Logging and process-wide facts
# ---------------------------------------------------------------------------------------------------------------
_LOG_CALLBACK = lc.llama_log_callback(lambda level, text, _user: llama_log.on_log(level, text))  # kept alive
_backend_ready = False


def init_backend(llama_log_level: str = "warning") -> None:
    """Route llama.cpp's logs into Python logging at ``llama_log_level`` and initialise the backend (once)."""
    global _backend_ready
    llama_log.set_level(llama_log_level)
    lc.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    if not _backend_ready:
        lc.llama_backend_init()
        _backend_ready = True


QUANT_TYPES = {"q4_0": lc.LLAMA_FTYPE_MOSTLY_Q4_0, "q8_0": lc.LLAMA_FTYPE_MOSTLY_Q8_0}


def quantize(src: str, dst: str, quant: str, threads: int = 0) -> None:
    """Write ``src``'s model to ``dst`` with every tensor in ``quant`` (a key of :data:`QUANT_TYPES`: block size 32,
    so any width a model has), by llama.cpp's own quantizer; an already quantized model is quantized again from its
    dequantized weights: a smaller, cheaper copy of it, such as a draft model for speculative decoding.
    ``RuntimeError`` if llama.cpp fails."""
    init_backend()
    p = lc.llama_model_quantize_default_params()
    p.ftype = QUANT_TYPES[quant]
    p.nthread = threads
    p.allow_requantize = True
    p.pure = True  # the token embedding and output head too (by default they keep a larger type)
    if lc.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to {quant} (see the llama_cpp log above)")


def supports_gpu_offload() -> bool:
    """Whether the installed llama.cpp offloads to a GPU of this host. llama.cpp's own llama_supports_gpu_offload()
    also says yes for the RPC backend alone, which offloads to other hosts' devices: a CPU build with RPC (every
    build the project makes) would pass for a GPU one. So this host's devices are asked instead."""
    return bool(_local_devices((_DEV_GPU, _DEV_IGPU)))


def system_info() -> str:
    """llama.cpp's description of compiled CPU features and backends."""
    return bytes(lc.llama_print_system_info()).decode("utf-8", errors="replace")

# ---------------------------------------------------------------------------------------------------------------
# Devices and llama.cpp's RPC backend (other hosts' devices), through ggml's registry and its proc addresses
# ---------------------------------------------------------------------------------------------------------------
def _ggml(name: str, restype: Any, *argtypes: Any) -> Any:
    """A ggml function, found through libllama's handle (ggml's libraries are its dependencies)."""
    fn = getattr(lc.llama_cpp._lib, name)
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


_P, _SIZE = ctypes.c_void_p, ctypes.c_size_t
_reg_by_name = _ggml("ggml_backend_reg_by_name", _P, ctypes.c_char_p)
_reg_name = _ggml("ggml_backend_reg_name", ctypes.c_char_p, _P)
_reg_proc = _ggml("ggml_backend_reg_get_proc_address", _P, _P, ctypes.c_char_p)
_reg_dev_count = _ggml("ggml_backend_reg_dev_count", _SIZE, _P)
_reg_dev_get = _ggml("ggml_backend_reg_dev_get", _P, _P, _SIZE)
_dev_count = _ggml("ggml_backend_dev_count", _SIZE)
_dev_get = _ggml("ggml_backend_dev_get", _P, _SIZE)
_dev_reg = _ggml("ggml_backend_dev_backend_reg", _P, _P)
_dev_type = _ggml("ggml_backend_dev_type", ctypes.c_int, _P)
_dev_memory = _ggml("ggml_backend_dev_memory", None, _P, ctypes.POINTER(_SIZE), ctypes.POINTER(_SIZE))
_DEV_CPU, _DEV_GPU, _DEV_IGPU = 0, 1, 2  # enum ggml_backend_dev_type
_ADD_SERVER = ctypes.CFUNCTYPE(_P, ctypes.c_char_p)
_START_SERVER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, _SIZE, _SIZE, ctypes.POINTER(_P))


def _rpc_proc(name: str) -> int:
    reg = _reg_by_name(b"RPC")
    if not reg:
        raise RuntimeError("this llama.cpp build has no RPC backend: rebuild llama-cpp-python with -DGGML_RPC=ON "
                           "(scripts/install.sh does)")
    return int(_reg_proc(reg, name.encode()))


def rpc_devices(endpoint: str) -> list[int]:
    """The devices of the RPC server at ``endpoint`` (``host:port``), as ggml device handles.

    llama.cpp aborts the process if nothing answers there: check the endpoint first (``llamafleet.rpc``).
    """
    reg = _ADD_SERVER(_rpc_proc("ggml_backend_rpc_add_server"))(endpoint.encode())
    if not reg:
        raise RuntimeError(f"RPC server {endpoint} reports no devices")
    return [int(_reg_dev_get(reg, i)) for i in range(_reg_dev_count(reg))]


def device_memory(dev: int) -> tuple[int, int]:
    """(free, total) bytes of a device; for an RPC device, as its server reports them."""
    free, total = _SIZE(), _SIZE()
    _dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return int(free.value), int(total.value)


def _local_devices(kinds: tuple[int, ...]) -> list[int]:
    devs = [int(_dev_get(i)) for i in range(_dev_count())]
    return [d for d in devs if _dev_type(d) in kinds and _reg_name(_dev_reg(d)) != b"RPC"]


def _own_devices() -> list[int]:
    """This host's GPUs (those the process sees), or its CPU when it sees none."""
    return _local_devices((_DEV_GPU, _DEV_IGPU)) or _local_devices((_DEV_CPU,))


def model_devices(rpc_servers: Sequence[str]) -> ctypes.Array[ctypes.c_void_p]:
    """The NULL-terminated device list for a model split over RPC servers: their devices first (as llama.cpp orders
    them), then this host's GPUs or CPU, so the last layers and the output head stay here and only activations
    cross the network, not logits."""
    devs = [d for e in rpc_servers for d in rpc_devices(e)] + _own_devices()
    return (_P * (len(devs) + 1))(*devs, None)


def serve_rpc(endpoint: str, n_threads: int, cache_dir: str | None) -> None:
    """Be llama.cpp's RPC server on ``endpoint`` until the process is killed (what its rpc-server tool runs) for
    :func:`_own_devices`. Returns only if it could not start (it says why on stderr)."""
    devs = _own_devices()
    arr = (_P * len(devs))(*devs)
    start = _START_SERVER(_rpc_proc("ggml_backend_rpc_start_server"))
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads, len(devs), arr)


class Native:
    """Base for objects that own native memory: ``close()`` is idempotent and ``with`` calls it."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
