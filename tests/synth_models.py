"""Sparse LLaMA-2-shaped models (7B/13B/70B x Q4_0/Q8_0/F16) written by ``llamafleet synth`` for planner tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafleet.model.header import ModelInfo, read_model_info
from llamafleet.model.synth import SHAPES, find_vocab, write_model

SIZES = ("7b", "13b", "70b")
QUANTS = ("q4_0", "q8_0", "f16")


_written: dict[str, dict[str, ModelInfo]] = {}


def sparse_models(factory: pytest.TempPathFactory) -> dict[str, ModelInfo]:
    """Every size x quant as a sparse file, described; keys like ``"70b-q8_0"``. Written once per test session."""
    if "all" not in _written:
        _written["all"] = _write(factory.mktemp("sparse-models"))
    return _written["all"]


def _write(folder: Path) -> dict[str, ModelInfo]:
    vocab = find_vocab()
    out = {}
    for size in SIZES:
        for quant in QUANTS:
            path = write_model(folder / f"llama2-{size}-{quant}.gguf", SHAPES[f"llama2-{size}"], quant, vocab,
                               sparse=True, progress=False)
            out[f"{size}-{quant}"] = read_model_info(path)
    return out
