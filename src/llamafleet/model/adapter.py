"""A LoRA adapter GGUF described from its header: which architecture it adapts and how many bytes its tensors hold
(what it adds to a replica's memory: llama.cpp loads the tensors beside the base model's, on the same devices)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamafleet.model.header import GgufError, read_header


@dataclass(frozen=True)
class AdapterInfo:
    path: str
    architecture: str
    tensor_bytes: int  # the sum of its tensors' sizes
    n_tensors: int


def read_adapter_info(path: str | Path, architecture: str | None = None) -> AdapterInfo:
    """Describe the LoRA adapter at ``path``; ``GgufError`` saying why if it is not one (or adapts another
    ``architecture`` than the one given)."""
    p = Path(path)
    if not p.is_file():
        raise GgufError(f"no file at {p}")
    meta, tensors = read_header(p)
    kind, adapter, arch = meta.get("general.type"), meta.get("adapter.type"), meta.get("general.architecture")
    if kind != "adapter" or adapter != "lora":
        raise GgufError(f"{p} is not a LoRA adapter (general.type {kind!r}, adapter.type {adapter!r}; want "
                        "'adapter' and 'lora': convert it with llama.cpp's convert_lora_to_gguf.py)")
    if not isinstance(arch, str):
        raise GgufError(f"{p}: no 'general.architecture' in the header")
    if architecture is not None and arch != architecture:
        raise GgufError(f"{p} adapts a {arch} model, not this {architecture} model")
    if not any(t.name.endswith(".lora_a") for t in tensors):
        raise GgufError(f"{p} holds no LoRA tensors (*.lora_a, *.lora_b)")
    return AdapterInfo(str(p), arch, sum(t.n_bytes for t in tensors), len(tensors))
