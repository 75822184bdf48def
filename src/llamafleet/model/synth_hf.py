"""Write a LLaMA checkpoint folder in Hugging Face's layout with random weights, for the torch engine's tests and
benchmarks: ``config.json``, the weights as safetensors (sharded past ``shard_bytes``, with the index), and a real
tokenizer with a chat template (``tokenizer.json``, ``tokenizer_config.json``).

The safetensors files are written here, a header and the raw tensors in chunks, so a 7B checkpoint never sits whole
in memory and no ``torch`` is needed. Weights follow LLaMA's initialisation (normal, std 0.02; norms 1), seeded: the
same seed gives the same checkpoint. The tokenizer is a vocab GGUF of llama.cpp's (LLaMA-2's by default, the one
``llamafleet synth`` uses) converted by ``transformers``' GGUF reader, so both engines tokenize with one vocabulary.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from llamafleet.model.checkpoint import CONFIG, INDEX
from llamafleet.model.synth import Shape
from llamafleet.paths import cache_dir, partial_path

DTYPES = {"f32": ("F32", "float32", 4), "f16": ("F16", "float16", 2), "bf16": ("BF16", "bfloat16", 2)}
CHUNK = 1 << 24  # elements generated at a time
SHARD_BYTES = 4 << 30


def hf_tensors(shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """The tensors of a LLaMA checkpoint in Hugging Face's names and (out, in) shapes."""
    e, kv = shape.n_embd, shape.n_head_kv * shape.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (shape.n_vocab, e))]
    for i in range(shape.n_layer):
        b = f"model.layers.{i}."
        out += [(b + "input_layernorm.weight", (e,)), (b + "self_attn.q_proj.weight", (e, e)),
                (b + "self_attn.k_proj.weight", (kv, e)), (b + "self_attn.v_proj.weight", (kv, e)),
                (b + "self_attn.o_proj.weight", (e, e)), (b + "post_attention_layernorm.weight", (e,)),
                (b + "mlp.gate_proj.weight", (shape.n_ff, e)), (b + "mlp.up_proj.weight", (shape.n_ff, e)),
                (b + "mlp.down_proj.weight", (e, shape.n_ff))]
    return out + [("model.norm.weight", (e,)), ("lm_head.weight", (shape.n_vocab, e))]


def hf_config(shape: Shape, dtype: str) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": shape.n_embd,
        "intermediate_size": shape.n_ff, "num_hidden_layers": shape.n_layer,
        "num_attention_heads": shape.n_head, "num_key_value_heads": shape.n_head_kv, "head_dim": shape.head_dim,
        "max_position_embeddings": shape.n_ctx, "vocab_size": shape.n_vocab, "rms_norm_eps": 1e-5,
        "rope_theta": shape.rope_base, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "dtype": DTYPES[dtype][1],
        "torch_dtype": DTYPES[dtype][1],  # the name before transformers 5
    }


def _values(name: str, n: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """The tensor's values in float32 chunks: ones for norms, normal(0, 0.02) otherwise."""
    for start in range(0, n, CHUNK):
        k = min(CHUNK, n - start)
        if name.endswith("norm.weight"):
            yield np.ones(k, dtype=np.float32)
        else:
            yield (rng.standard_normal(k, dtype=np.float32) * np.float32(0.02)).astype(np.float32)


def _encode(chunk: np.ndarray, dtype: str) -> bytes:
    if dtype == "f32":
        return chunk.astype("<f4").tobytes()
    if dtype == "f16":
        return chunk.astype("<f2").tobytes()
    return (chunk.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()  # bf16: the top half of float32


def _write_shard(f: BinaryIO, tensors: list[tuple[str, tuple[int, ...]]], dtype: str,
                 rng: np.random.Generator) -> None:
    code, _, size = DTYPES[dtype]
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dims in tensors:
        n = int(np.prod(dims)) * size
        header[name] = {"dtype": code, "shape": list(dims), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    f.write(struct.pack("<Q", len(raw)) + raw)
    for name, dims in tensors:
        for chunk in _values(name, int(np.prod(dims)), rng):
            f.write(_encode(chunk, dtype))


def _shards(tensors: list[tuple[str, tuple[int, ...]]], size: int, limit: int
            ) -> list[list[tuple[str, tuple[int, ...]]]]:
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    used = 0
    for t in tensors:
        n = int(np.prod(t[1])) * size
        if shards[-1] and used + n > limit:
            shards.append([])
            used = 0
        shards[-1].append(t)
        used += n
    return shards


def write_tokenizer(folder: Path, vocab: Path, chat_template: str) -> None:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja`` from the vocab GGUF ``vocab``. The
    conversion (seconds) is done once per vocabulary and kept in the cache folder."""
    cached = cache_dir() / "hf-tokenizers" / f"{vocab.stem}-{vocab.stat().st_size}"
    if not (cached / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tmp = partial_path(cached)
        AutoTokenizer.from_pretrained(str(vocab.parent), gguf_file=vocab.name).save_pretrained(str(tmp))
        (tmp / "chat_template.jinja").unlink(missing_ok=True)
        if (cached / "tokenizer.json").is_file():  # another process finished first
            shutil.rmtree(tmp)
        else:
            shutil.rmtree(cached, ignore_errors=True)
            os.replace(tmp, cached)
    for f in cached.iterdir():
        shutil.copyfile(f, folder / f.name)
    (folder / "chat_template.jinja").write_text(chat_template, encoding="utf-8")


def write_weights(folder: str | Path, shape: Shape, dtype: str, seed: int = 0, shard_bytes: int = SHARD_BYTES) -> Path:
    """``config.json`` and the weights of ``shape`` (in ``dtype``: f32, f16 or bf16) into ``folder``: a checkpoint
    without its tokenizer (enough for the planner)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = hf_tensors(shape)
    shards = _shards(tensors, DTYPES[dtype][2], shard_bytes)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    for name, part in zip(names, shards, strict=True):
        with (out / name).open("wb") as f:
            _write_shard(f, part, dtype, rng)
    if len(shards) > 1:
        wmap = {t: name for name, part in zip(names, shards, strict=True) for t, _ in part}
        (out / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": wmap}, indent=1))
    (out / CONFIG).write_text(json.dumps(hf_config(shape, dtype), indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return out


def write_checkpoint(folder: str | Path, shape: Shape, dtype: str, vocab: Path, chat_template: str, seed: int = 0,
                     shard_bytes: int = SHARD_BYTES) -> Path:
    """A whole checkpoint: :func:`write_weights` and the tokenizer (:func:`write_tokenizer`)."""
    out = write_weights(folder, shape, dtype, seed, shard_bytes)
    write_tokenizer(out, vocab, chat_template)
    return out
