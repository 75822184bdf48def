"""The header reader against the ``gguf`` package's own reader, on files ``synth`` writes and on the real model."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from llamafleet.model.header import GgufError, read_fields, read_header, read_model_info
from llamafleet.model.synth import SHAPES, find_vocab, write_model
from synth_models import split_model

MIB = 2**20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("m") / "tiny.gguf", SHAPES["tiny"], "q8_0", find_vocab(),
                       progress=False)


@pytest.fixture(scope="module")
def reference(tiny: Path) -> gguf.GGUFReader:
    """The gguf package's reader: slow (it decodes the whole vocabulary), so read once."""
    return gguf.GGUFReader(tiny)


def test_tensor_table_matches_gguf_reader(tiny: Path, reference: gguf.GGUFReader) -> None:
    meta, tensors = read_header(tiny)
    assert [t.name for t in tensors] == [t.name for t in reference.tensors]
    for mine, ref in zip(tensors, reference.tensors, strict=True):
        assert mine.offset == ref.data_offset
        assert mine.n_bytes == ref.n_bytes
        assert mine.shape == tuple(int(x) for x in ref.shape)
        assert mine.ggml_type == ref.tensor_type.name
    assert meta["llama.block_count"] == 4
    assert meta["tokenizer.ggml.tokens"] is None  # long arrays are skipped, not decoded


def test_model_info_of_tiny(tiny: Path, reference: gguf.GGUFReader) -> None:
    m = read_model_info(tiny)
    assert (m.architecture, m.n_layer, m.n_embd, m.n_head, m.n_head_kv, m.head_dim, m.n_ff) == (
        "llama", 4, 256, 4, 2, 64, 768)
    assert (m.n_vocab, m.n_ctx_train, m.file_type) == (32000, 2048, "Q8_0")
    assert m.weights_bytes == sum(t.n_bytes for t in reference.tensors)
    assert m.weights_bytes == sum(m.layer_bytes) + m.non_layer_bytes
    embd = 32000 * 256 // 32 * 34  # Q8_0: 34 bytes per 32 weights
    assert m.input_bytes == embd
    assert m.output_bytes == embd + 256 * 4  # head + F32 output norm
    assert len(set(m.layer_bytes)) == 1 and not m.tied_embeddings
    assert m.kv_elements_per_token == 4 * 2 * (64 + 64)


def test_sparse_70b_is_described_from_its_header(tmp_path: Path) -> None:
    path = write_model(tmp_path / "70b.gguf", SHAPES["llama2-70b"], "q4_0", find_vocab(), sparse=True,
                       progress=False)
    m = read_model_info(path)
    assert (m.n_layer, m.n_embd, m.n_head, m.n_head_kv, m.head_dim, m.n_ff) == (80, 8192, 64, 8, 128, 28672)
    per_layer = (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672) // 32 * 18 + 2 * 8192 * 4
    assert m.layer_bytes == (per_layer,) * 80
    assert m.n_params == 68_976_648_192
    assert 36.0 < m.weights_bytes / 2**30 < 36.3  # the known size of LLaMA-2-70B in Q4_0


def test_real_model_with_tied_embeddings(model_path: Path) -> None:
    m = read_model_info(model_path)
    assert (m.architecture, m.n_layer, m.n_embd, m.n_head, m.n_head_kv, m.n_vocab) == ("llama", 30, 576, 9, 3, 49152)
    assert m.file_type == "Q4_1"
    _, tensors = read_header(model_path)
    names = {t.name for t in tensors}
    assert "output.weight" not in names and m.tied_embeddings  # llama.cpp places a copy of the embedding as head
    embd = next(t for t in tensors if t.name == "token_embd.weight")
    assert m.output_bytes == embd.n_bytes + 576 * 4


def test_read_fields_decodes_arrays_in_full(tiny: Path, reference: gguf.GGUFReader) -> None:
    fields = read_fields(tiny, "tokenizer.")
    ref = reference
    tokens = fields["tokenizer.ggml.tokens"]
    assert tokens.value == ref.fields["tokenizer.ggml.tokens"].contents()
    assert tokens.vtype == gguf.GGUFValueType.ARRAY and tokens.sub_type == gguf.GGUFValueType.STRING
    assert fields["tokenizer.ggml.scores"].value == pytest.approx(ref.fields["tokenizer.ggml.scores"].contents())
    assert fields["tokenizer.ggml.bos_token_id"].value == 1
    assert all(k.startswith("tokenizer.") for k in fields)


def test_errors_say_what_is_wrong(tmp_path: Path, tiny: Path) -> None:
    with pytest.raises(GgufError, match="model file not found"):
        read_model_info(tmp_path / "missing.gguf")
    with pytest.raises(GgufError, match="is a directory"):
        read_model_info(tmp_path)
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a model")
    with pytest.raises(GgufError, match=r"is not a GGUF file \(it starts with b'hell'"):
        read_model_info(text)
    with pytest.raises(GgufError, match="holds no tensors"):
        read_model_info(find_vocab())
    data = tiny.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(GgufError, match="ends past the end of the file"):
        read_model_info(cut)
    cut.write_bytes(data[:300])
    with pytest.raises(GgufError, match="header ends early"):
        read_model_info(cut)


def test_a_split_model_is_described_over_all_its_parts(tmp_path: Path, tiny: Path) -> None:
    parts = split_model(tiny, tmp_path, 3)
    whole, split = read_model_info(tiny), read_model_info(parts[0])
    assert (split.n_tensors, split.weights_bytes, split.layer_bytes) == (whole.n_tensors, whole.weights_bytes,
                                                                          whole.layer_bytes)
    assert split.file_bytes == sum(p.stat().st_size for p in parts)
    with pytest.raises(GgufError, match="is a part of a model split in 3; give its first part"):
        read_model_info(parts[1])
    parts[2].unlink()
    with pytest.raises(GgufError, match="model file not found: .*tiny-00003-of-00003.gguf"):
        read_model_info(parts[0])
