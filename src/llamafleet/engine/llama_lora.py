"""llama.cpp's LoRA adapters: loading one onto a model, and setting a context's adapters with their scales.

One of the four bindings modules (see :mod:`llamafleet.engine.llama`). llama.cpp applies adapters per context, not per
sequence: every sequence of a ``llama_decode`` runs with the adapters set on its context at that moment; a change of
adapters makes llama.cpp reserve its compute buffers again at the next decode, and an adapter of scale 0 is left out
(the base model exactly).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp as lc  # isort: skip  (before numpy, see engine/llama.py)

from llamafleet.engine.llama import Context, Model
from llamafleet.engine.llama_backend import Native


class LoraAdapter(Native):
    """A LoRA adapter GGUF loaded onto ``model`` (freed by ``close()``, or with the model)."""

    def __init__(self, model: Model, path: str) -> None:
        ptr = lc.llama_adapter_lora_init(model.ptr, path.encode())
        if not ptr:
            raise ValueError(f"llama.cpp could not load the LoRA adapter {path} onto this model (see the llama_cpp "
                             "log above: another architecture, or shapes of another base model)")
        self.ptr = ptr

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_adapter_lora_free(self.ptr)
            self.ptr = None


def set_adapters(ctx: Context, adapters: Sequence[tuple[LoraAdapter, float]]) -> None:
    """Make ``adapters`` (each with its scale) the context's from its next decode on; none: the base model alone.
    llama.cpp changes nothing when they are already the ones set."""
    n = len(adapters)
    ptrs = (lc.llama_adapter_lora_p_ctypes * n)(*(a.ptr for a, _ in adapters))
    scales = (ctypes.c_float * n)(*(s for _, s in adapters))
    rc = lc.llama_set_adapters_lora(ctx.ptr, ptrs if n else None, n, scales if n else None)
    if rc != 0:
        raise RuntimeError(f"llama_set_adapters_lora failed with status {rc}")
