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


def split_model(src: Path, folder: Path, parts: int) -> list[Path]:
    """``src`` (a real GGUF) split as llama.cpp's gguf-split splits it: ``STEM-0000K-of-0000N.gguf`` in ``folder``,
    the metadata in the first part, the tensors spread over all."""
    import logging
    import math

    from gguf import GGUFReader, GGUFWriter

    from llamafleet.model.header import read_fields

    logging.getLogger("gguf.gguf_writer").setLevel(logging.ERROR)
    reader = GGUFReader(src)
    writer = GGUFWriter(folder / src.name, None, split_max_tensors=math.ceil(len(reader.tensors) / parts))
    for key, field in read_fields(src, "").items():
        writer.add_key_value(key, field.value, field.vtype, field.sub_type)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return [folder / f"{src.stem}-{i:05d}-of-{parts:05d}.gguf" for i in range(1, parts + 1)]
