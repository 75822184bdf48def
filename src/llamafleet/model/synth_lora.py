"""Write a LoRA adapter GGUF for a model file (random low-rank weights), in the layout llama.cpp's adapter loader reads.

An adapter adds ``scale * (alpha / rank) * B @ A`` to chosen weight matrices of its base model: for each target
``blk.N.{target}.weight`` of shape ``(n_out, n_in)`` it holds ``...weight.lora_a`` (``rank x n_in``) and
``...weight.lora_b`` (``n_out x rank``), with ``general.type = adapter``, ``adapter.type = lora`` and
``adapter.lora.alpha``, under the base's architecture. The weights are random (B is not zero, as a fresh
fine-tune's would be), so any nonzero scale changes the base model's logits and a scale of zero changes nothing:
what the tests and the probe need, on any base (the demo model, or what ``llamafleet synth`` writes).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from llamafleet.model.header import GgufError, read_header

TARGETS = ("attn_q", "attn_v")  # the usual LoRA targets: the query and value projections


def write_lora(base: str | Path, out: str | Path, *, rank: int = 8, alpha: float = 16.0,
               targets: tuple[str, ...] = TARGETS, seed: int = 0, std: float = 1.0) -> Path:
    """Write an adapter for the model file ``base`` to ``out``; returns the path. ``std`` scales the random weights
    (each matrix's entries ``std / sqrt(its inner size)``)."""
    meta, tensors = read_header(Path(base))
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise GgufError(f"{base}: no 'general.architecture' in the header")
    chosen = [t for t in tensors if t.name.startswith("blk.") and t.name.rsplit(".", 2)[-2] in targets
              and t.name.endswith(".weight") and len(t.shape) == 2]
    if not chosen:
        raise GgufError(f"{base}: no weight named {', '.join(targets)} in its blocks to adapt")
    rng = np.random.default_rng(seed)
    w = GGUFWriter(Path(out), arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    w.add_name(f"llamafleet synthetic LoRA (rank {rank}) for {Path(base).name}")
    for t in chosen:
        n_in, n_out = t.shape  # ggml order: the row length first
        a = rng.standard_normal((rank, n_in), dtype=np.float32) * np.float32(std / math.sqrt(n_in))
        b = rng.standard_normal((n_out, rank), dtype=np.float32) * np.float32(std / math.sqrt(rank))
        w.add_tensor(f"{t.name}.lora_a", a)
        w.add_tensor(f"{t.name}.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)
