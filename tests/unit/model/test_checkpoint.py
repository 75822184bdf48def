"""A checkpoint folder described for the planner from config.json and the safetensors headers, and what is refused
at load: no config.json, another architecture, custom code, shards that do not match their index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamafleet.model.checkpoint import INDEX, CheckpointError, describe, read_checkpoint_info
from llamafleet.model.synth import Shape
from llamafleet.model.synth_hf import write_weights

SHAPE = Shape("t", n_layer=3, n_embd=64, n_head=4, n_head_kv=2, n_ff=96, n_ctx=1024, n_vocab=500)


def params(s: Shape) -> int:
    kv = s.n_head_kv * s.head_dim
    layer = 2 * s.n_embd + 2 * s.n_embd * s.n_embd + 2 * kv * s.n_embd + 3 * s.n_ff * s.n_embd
    return 2 * s.n_vocab * s.n_embd + s.n_layer * layer + s.n_embd


@pytest.mark.parametrize(("dtype", "size"), [("f32", 4), ("bf16", 2), ("f16", 2)])
def test_the_shape_and_bytes_come_from_the_headers(tmp_path: Path, dtype: str, size: int) -> None:
    info = describe(write_weights(tmp_path / "m", SHAPE, dtype))
    assert info.engine == "torch" and info.architecture == "llama"
    assert (info.n_layer, info.n_embd, info.n_head, info.n_head_kv, info.head_dim) == (3, 64, 4, 2, 16)
    assert info.n_params == params(SHAPE) and info.weights_bytes == params(SHAPE) * size
    assert info.file_type == dtype.upper() and info.n_vocab == 500 and info.n_ctx_train == 1024
    assert info.weights_bytes == sum(info.layer_bytes) + info.non_layer_bytes
    assert info.input_bytes == 500 * 64 * size and not info.tied_embeddings


def test_shards_and_their_index_are_read_together(tmp_path: Path) -> None:
    folder = write_weights(tmp_path / "m", SHAPE, "f32", shard_bytes=60_000)
    assert len(list(folder.glob("*.safetensors"))) > 2 and (folder / INDEX).is_file()
    assert read_checkpoint_info(folder).n_params == params(SHAPE)


def test_a_folder_without_config_json_is_refused_with_what_was_found(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"no config.json \(found: weights.bin\)"):
        describe(tmp_path)


def test_another_architecture_or_custom_code_is_refused(tmp_path: Path) -> None:
    folder = write_weights(tmp_path / "m", SHAPE, "f32")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2", "architectures": ["GPT2LMHead"]}))
    with pytest.raises(CheckpointError, match="model_type is 'gpt2'.*LLaMA-architecture"):
        describe(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModel": "x.Model"}}))
    with pytest.raises(CheckpointError, match="trust_remote_code stays off"):
        describe(folder)


def test_mismatched_shards_are_a_load_error(tmp_path: Path) -> None:
    folder = write_weights(tmp_path / "m", SHAPE, "f32", shard_bytes=60_000)
    index = json.loads((folder / INDEX).read_text())
    first, *_ = sorted(folder.glob("*.safetensors"))
    wmap = index["weight_map"]
    moved = next(n for n, f in wmap.items() if f != first.name)
    (folder / INDEX).write_text(json.dumps({**index, "weight_map": {**wmap, moved: first.name}}))
    with pytest.raises(CheckpointError, match="mismatched shards"):
        describe(folder)
    (folder / INDEX).write_text(json.dumps(index))
    last = sorted(folder.glob("*.safetensors"))[-1]
    last.unlink()
    with pytest.raises(CheckpointError, match="shards that are not there"):
        describe(folder)


def test_a_missing_layer_or_a_truncated_header_is_refused(tmp_path: Path) -> None:
    folder = write_weights(tmp_path / "m", SHAPE, "f32")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 4}))
    with pytest.raises(CheckpointError, match="layer 3 has no weights"):
        describe(folder)
    (folder / "model.safetensors").write_bytes(b"\x05")
    with pytest.raises(CheckpointError, match="too short"):
        describe(folder)
