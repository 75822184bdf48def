"""What the planner needs to know about a Hugging Face checkpoint folder, read without loading a weight.

A checkpoint is a folder: ``config.json`` (the architecture and its shape), one or more ``*.safetensors`` files (each
starts with a little-endian u64 and that many bytes of JSON naming every tensor, its dtype, shape and byte range)
and, when sharded, ``model.safetensors.index.json`` mapping each tensor to its file. From those this module gives the
same :class:`~llamafleet.model.header.ModelInfo` a GGUF header gives, with ``engine="torch"``: bytes per layer as
stored, the token embedding, the output head, the head counts that size the KV cache. Only LLaMA-architecture
checkpoints are described (``model_type`` ``llama``); anything else is a :class:`CheckpointError` naming what was
found. So are shards that do not match their index (a file missing, a tensor in no file or in two).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llamafleet.model.header import GgufError, ModelInfo, read_model_info

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
MODEL_TYPES = ("llama",)  # what the torch engine runs (LlamaForCausalLM)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
MAX_HEADER = 100 << 20  # a safetensors header larger than this is not one
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class CheckpointError(GgufError):
    """The folder is not a checkpoint the torch engine can serve; the message says what was found and the fix. (A
    :class:`GgufError`: every command that reports an unreadable model reports this one the same way.)"""


def is_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` names a folder (served by the torch engine) rather than a GGUF file."""
    return Path(path).is_dir()


def describe(path: str | Path) -> ModelInfo:
    """The planner's description of a model: a checkpoint folder's (torch engine) or a GGUF file's (llama.cpp)."""
    return read_checkpoint_info(path) if is_checkpoint(path) else read_model_info(path)


def read_config(folder: Path) -> dict[str, Any]:
    """``config.json``, checked to be a LLaMA model that runs without remote code."""
    path = folder / CONFIG
    if not path.is_file():
        found = ", ".join(sorted(p.name for p in folder.iterdir())[:12]) or "nothing"
        raise CheckpointError(f"{folder} has no {CONFIG} (found: {found}); a model folder needs config.json, "
                              "*.safetensors and the tokenizer, as Hugging Face's save_pretrained writes them")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} cannot be read as JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    kind = cfg.get("model_type")
    if kind not in MODEL_TYPES:
        arch = cfg.get("architectures")
        raise CheckpointError(f"{path}: model_type is {kind!r} (architectures {arch}); the torch engine serves "
                              f"LLaMA-architecture checkpoints ({', '.join(MODEL_TYPES)}) only; convert other "
                              "models to GGUF for the llama.cpp engine")
    if cfg.get("auto_map"):
        raise CheckpointError(f"{path} names custom code (auto_map); llamafleet never runs a checkpoint's own code "
                              "(trust_remote_code stays off)")
    return cfg


def _header(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise CheckpointError(f"{path} is too short to be a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER:
                raise CheckpointError(f"{path} is not a safetensors file (header length {n})")
            meta = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read its safetensors header ({e})") from None
    meta.pop("__metadata__", None)
    return dict(meta)


def tensor_table(folder: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """Every tensor of the checkpoint: name -> (dtype, shape, file name), checked against the index if any."""
    files = sorted(p for p in folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no *.safetensors file; the torch engine loads safetensors weights only "
                              "(convert .bin files with save_pretrained(safe_serialization=True))")
    table: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for f in files:
        for name, t in _header(f).items():
            if name in table:
                raise CheckpointError(f"tensor {name} is in both {table[name][2]} and {f.name}: mismatched shards")
            table[name] = (str(t["dtype"]), tuple(int(x) for x in t["shape"]), f.name)
    index = folder / INDEX
    if index.is_file():
        try:
            wmap: Mapping[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"{index} cannot be read ({e})") from None
        missing = sorted({f for f in wmap.values() if not (folder / f).is_file()})
        if missing:
            raise CheckpointError(f"{index} names shards that are not there: {', '.join(missing[:5])}")
        wrong = [n for n, f in wmap.items() if n not in table or table[n][2] != f]
        if wrong:
            raise CheckpointError(f"mismatched shards: {len(wrong)} tensor(s) of {INDEX} are not in the file it "
                                  f"names (first: {wrong[0]})")
    return table


def _n_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    n = DTYPE_BYTES.get(dtype)
    if n is None:
        raise CheckpointError(f"a tensor has dtype {dtype}, which the torch engine does not load")
    for d in shape:
        n *= d
    return n


def read_checkpoint_info(path: str | Path) -> ModelInfo:
    """The planner's description of the checkpoint folder ``path`` (see the module's docstring)."""
    folder = Path(path)
    cfg = read_config(folder)
    table = tensor_table(folder)
    n_layer = int(cfg["num_hidden_layers"])
    n_embd, n_head = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or n_embd // n_head)
    layer_bytes = [0] * n_layer
    by_type: dict[str, int] = {}
    total = params = 0
    for name, (dtype, shape, _) in table.items():
        size = _n_bytes(dtype, shape)
        total += size
        params += size // DTYPE_BYTES[dtype]
        by_type[dtype] = by_type.get(dtype, 0) + size
        if m := _LAYER.match(name):
            i = int(m.group(1))
            if i >= n_layer:
                raise CheckpointError(f"tensor {name} is past num_hidden_layers ({n_layer}) of config.json")
            layer_bytes[i] += size
    if "model.embed_tokens.weight" not in table:
        raise CheckpointError(f"{folder} has no model.embed_tokens.weight: not a LLaMA checkpoint, or shards missing")
    empty = [i for i, b in enumerate(layer_bytes) if b == 0]
    if empty:
        raise CheckpointError(f"layer {empty[0]} has no weights in {folder}: shards are missing or mismatched")
    tied = "lm_head.weight" not in table
    sizes = {n: _n_bytes(d, s) for n, (d, s, _) in table.items()}
    types = tuple(sorted(by_type.items(), key=lambda kv: -kv[1]))
    return ModelInfo(
        path=str(folder), architecture="llama", name=folder.name, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
        n_head_kv=int(cfg.get("num_key_value_heads") or n_head), head_dim=head_dim, head_dim_v=head_dim,
        n_ff=int(cfg["intermediate_size"]), n_ctx_train=int(cfg.get("max_position_embeddings") or 0),
        n_vocab=int(cfg["vocab_size"]), file_type=types[0][0], weights_bytes=total, layer_bytes=tuple(layer_bytes),
        non_layer_bytes=total - sum(layer_bytes), input_bytes=sizes["model.embed_tokens.weight"],
        output_bytes=sizes.get("lm_head.weight", sizes["model.embed_tokens.weight"])
        + sizes.get("model.norm.weight", 0),
        tied_embeddings=tied,
        file_bytes=sum(f.stat().st_size for f in folder.glob("*.safetensors")), n_tensors=len(table),
        n_params=params, tensor_types=types, engine="torch",
    )


def tokenizer_facts(folder: Path) -> dict[str, str]:
    """The chat template and the BOS and EOS tokens' texts of a checkpoint folder, as its ``tokenizer_config.json``
    (or ``chat_template.jinja``, where transformers now writes the template) gives them ("" for what it has not)."""
    path = folder / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    def text(value: Any) -> str:  # a token is written as its text, or as an AddedToken's fields
        return str(value.get("content", "")) if isinstance(value, dict) else str(value or "")

    template = cfg.get("chat_template")
    if not isinstance(template, str) and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    return {"chat_template": template if isinstance(template, str) else "", "bos_token": text(cfg.get("bos_token")),
            "eos_token": text(cfg.get("eos_token"))}
