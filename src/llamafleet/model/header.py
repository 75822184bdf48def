"""What the planner needs to know about a GGUF model, read from the file's header alone.

The header holds the metadata (architecture, layer count, head counts, context length) and, for each tensor, its
name, shape and type, from which the bytes per layer follow. No weight is read, so a 40 GB file (or a sparse one
written by ``llamafleet synth --sparse``) is described in milliseconds. ``gguf.GGUFReader`` would also do, but it
decodes every token string of the vocabulary into numpy arrays (seconds for a large vocabulary); this reader skips
arrays it does not need and takes the type tables (block sizes, names) from the ``gguf`` package.
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType

from llamafleet.model.hub_ref import part_names, split_parts

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_SCALAR = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_SMALL_ARRAY = 4096  # numeric arrays up to this length are kept (per-layer head counts); longer ones are skipped
_BLOCK = re.compile(r"^blk\.(\d+)\.")
RANK_POOLING = 4  # llama.cpp's LLAMA_POOLING_TYPE_RANK, as {arch}.pooling_type stores it

Value = int | float | bool | str | tuple[int | float | bool, ...] | None


class GgufError(ValueError):
    """The file is not a GGUF model this reader can describe; the message says what is wrong."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header lists it. ``shape`` is in ggml order (``shape[0]`` is the row length)."""

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    n_bytes: int
    offset: int  # from the start of the file


@dataclass(frozen=True)
class ModelInfo:
    """A model's shape and the bytes of its weights, split the way llama.cpp places them on devices.

    ``layer_bytes[i]`` is block ``i``; ``input_bytes`` is the token embedding (llama.cpp keeps it in host memory);
    ``output_bytes`` is the output norm and head, which go with the last layer's device (a tied head is a copy of
    the token embedding there, except in host memory, where the embedding itself serves).
    ``non_layer_bytes`` = ``weights_bytes - sum(layer_bytes)`` as stored in the file.
    """

    path: str
    architecture: str
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int  # key length per head
    head_dim_v: int  # value length per head
    n_ff: int
    n_ctx_train: int
    n_vocab: int
    file_type: str
    weights_bytes: int
    layer_bytes: tuple[int, ...]
    non_layer_bytes: int
    input_bytes: int
    output_bytes: int
    tied_embeddings: bool  # no output.weight: the head is the token embedding
    file_bytes: int
    n_tensors: int
    n_params: int
    tensor_types: tuple[tuple[str, int], ...]  # (ggml type, bytes) largest first
    engine: str = "llama.cpp"  # what serves it: "llama.cpp" (a GGUF file) or "torch" (a checkpoint folder)
    reranker: bool = False  # its pooling type is "rank": it scores query-document pairs (/v1/rerank)

    @property
    def kv_elements_per_token(self) -> int:
        """K and V elements one token adds to the cache over all layers."""
        return self.n_layer * self.n_head_kv * (self.head_dim + self.head_dim_v)


def _scalar_format(vtype: int) -> str | None:
    """The struct format of a fixed-size metadata type; None for strings, arrays and unknown types."""
    try:
        return _SCALAR.get(GGUFValueType(vtype))
    except ValueError:
        return None


class _Reader:
    """Little-endian GGUF primitives over a binary file; every read checks for a truncated header."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f = f
        self.path = path

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise GgufError(f"{self.path}: header ends early at byte {self.f.tell()}; the file is truncated")
        return b

    def unpack(self, fmt: str) -> int | float | bool:
        v: int | float | bool = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return v

    def u32(self) -> int:
        return int(self.unpack("<I"))

    def u64(self) -> int:
        return int(self.unpack("<Q"))

    def string(self) -> str:
        return self.take(self.u64()).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Value:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            return self.array()
        fmt = _scalar_format(vtype)
        if fmt is None:
            raise GgufError(f"{self.path}: unknown metadata value type {vtype} at byte {self.f.tell()}")
        return self.unpack(fmt)

    def array(self) -> Value:
        etype, count = self.u32(), self.u64()
        if etype == GGUFValueType.STRING or etype == GGUFValueType.ARRAY or count > _SMALL_ARRAY:
            for _ in range(count):
                self.skip(etype)
            return None
        fmt = _scalar_format(etype)
        if fmt is None:
            raise GgufError(f"{self.path}: unknown array element type {etype} at byte {self.f.tell()}")
        size = struct.calcsize(fmt)
        raw = self.take(size * count)
        return tuple(struct.unpack_from(fmt, raw, i * size)[0] for i in range(count))

    def full(self, vtype: int) -> tuple[object, int | None]:
        """A value with arrays decoded in full, and their element type."""
        if vtype != GGUFValueType.ARRAY:
            return self.value(vtype), None
        etype, count = self.u32(), self.u64()
        if etype == GGUFValueType.STRING:
            return [self.string() for _ in range(count)], etype
        fmt = _scalar_format(etype)
        if fmt is None:
            raise GgufError(f"{self.path}: arrays of type {etype} cannot be copied (at byte {self.f.tell()})")
        return [x[0] for x in struct.iter_unpack(fmt, self.take(struct.calcsize(fmt) * count))], etype

    def skip(self, vtype: int) -> None:
        if vtype == GGUFValueType.STRING:
            self.f.seek(self.u64(), 1)
        elif vtype == GGUFValueType.ARRAY:
            etype, count = self.u32(), self.u64()
            fmt = _scalar_format(etype)
            if fmt is not None:
                self.f.seek(struct.calcsize(fmt) * count, 1)
            else:
                for _ in range(count):
                    self.skip(etype)
        else:
            self.value(vtype)


@dataclass(frozen=True)
class MetaField:
    """A metadata value with its GGUF types, for copying it into another file (arrays decoded in full)."""

    value: object
    vtype: GGUFValueType
    sub_type: GGUFValueType | None


def _open(p: Path) -> BinaryIO:
    try:
        return p.open("rb")
    except FileNotFoundError:
        raise GgufError(f"model file not found: {p}") from None
    except IsADirectoryError:
        raise GgufError(f"{p} is a directory; give the path of a .gguf file") from None


def _preamble(r: _Reader) -> tuple[int, int]:
    """Check magic and version; return (tensor count, metadata count)."""
    magic = r.f.read(4)
    if magic != GGUF_MAGIC:
        raise GgufError(f"{r.path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    version = r.u32()
    if version not in (2, 3):
        raise GgufError(f"{r.path}: GGUF version {version} is not supported (2 or 3 are; big-endian files are not)")
    return r.u64(), r.u64()


def read_fields(path: str | Path, prefix: str) -> dict[str, MetaField]:
    """The metadata keys of ``path`` that start with ``prefix`` (e.g. ``"tokenizer."``), arrays included."""
    p = Path(path)
    with _open(p) as f:
        r = _Reader(f, p)
        _, n_kv = _preamble(r)
        out: dict[str, MetaField] = {}
        for _ in range(n_kv):
            key, vtype = r.string(), r.u32()
            if key.startswith(prefix):
                value, sub = r.full(vtype)
                out[key] = MetaField(value, GGUFValueType(vtype), None if sub is None else GGUFValueType(sub))
            else:
                r.skip(vtype)
    return out


Opener = Callable[[str], tuple[BinaryIO, int]]  # a file's name -> the file opened for reading, and its size


def open_local(name: str) -> tuple[BinaryIO, int]:
    """The local file ``name`` and its size (the default :data:`Opener`)."""
    p = Path(name)
    f = _open(p)
    return f, os.fstat(f.fileno()).st_size


def read_header(path: str | Path, opener: Opener = open_local) -> tuple[dict[str, Value], list[TensorInfo]]:
    """The metadata (long arrays such as the vocabulary read as ``None``) and tensor list of a GGUF file."""
    meta, tensors, _ = _read(Path(path), opener)
    return meta, tensors


def _read(p: Path, opener: Opener) -> tuple[dict[str, Value], list[TensorInfo], int]:
    """:func:`read_header`'s answer and the file's size."""
    f, size = opener(str(p))
    with f:
        r = _Reader(f, p)
        n_tensors, n_kv = _preamble(r)
        meta: dict[str, Value] = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.u32())
        raw = []
        for _ in range(n_tensors):
            name = r.string()
            dims = tuple(r.u64() for _ in range(r.u32()))
            raw.append((name, dims, r.u32(), r.u64()))
        align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        align = align if isinstance(align, int) and align > 0 else DEFAULT_ALIGNMENT
        data_start = -(-f.tell() // align) * align
    tensors = []
    for name, dims, type_id, offset in raw:
        tensors.append(_tensor(p, name, dims, type_id, data_start + offset))
        if tensors[-1].offset + tensors[-1].n_bytes > size:
            raise GgufError(f"{p}: tensor {name} ends past the end of the file ({size} bytes); the file is truncated")
    return meta, tensors, size


def _split_tensors(p: Path, meta: Mapping[str, Value], opener: Opener) -> tuple[list[TensorInfo], int]:
    """The tensors and bytes of a split model's other parts (llama.cpp's ``NAME-0000K-of-0000N.gguf`` beside the
    first); none for a whole file."""
    count = meta.get("split.count")
    if not isinstance(count, int) or count <= 1:
        return [], 0
    parts = split_parts(p.name)
    if parts is None or parts[1] != 1:
        raise GgufError(f"{p} is a part of a model split in {count}; give its first part "
                        f"(NAME-00001-of-{count:05d}.gguf)")
    tensors, size = [], 0
    for name in part_names(p.name, count)[1:]:
        _, more, n = _read(p.with_name(name), opener)
        tensors += more
        size += n
    return tensors, size


def _tensor(p: Path, name: str, dims: tuple[int, ...], type_id: int, offset: int) -> TensorInfo:
    try:
        qtype = GGMLQuantizationType(type_id)
    except ValueError:
        raise GgufError(f"{p}: tensor {name} has ggml type {type_id}, unknown to the installed gguf package") from None
    block, type_size = GGML_QUANT_SIZES[qtype]
    n = math.prod(dims)
    if dims and dims[0] % block:
        raise GgufError(f"{p}: tensor {name} row length {dims[0]} is not a multiple of {qtype.name}'s block {block}")
    return TensorInfo(name=name, ggml_type=qtype.name, shape=dims, n_bytes=n // block * type_size, offset=offset)


def _int(meta: Mapping[str, Value], key: str, path: Path, default: int | None = None) -> int:
    v = meta.get(key)
    if isinstance(v, tuple) and v and all(isinstance(x, int) for x in v):
        return int(max(v))  # per-layer values: plan for the largest layer
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if default is not None:
        return default
    raise GgufError(f"{path}: metadata key '{key}' is missing or not an integer; is this a language model GGUF?")


def _file_type(meta: Mapping[str, Value], tensors: list[TensorInfo]) -> str:
    ft = meta.get("general.file_type")
    if isinstance(ft, int):
        try:
            return LlamaFileType(ft).name.removeprefix("MOSTLY_")
        except ValueError:
            pass
    matrices = [t for t in tensors if len(t.shape) >= 2]
    by_type: dict[str, int] = {}
    for t in matrices or tensors:
        by_type[t.ggml_type] = by_type.get(t.ggml_type, 0) + t.n_bytes
    return max(by_type, key=lambda k: by_type[k]) if by_type else "unknown"


def read_model_info(path: str | Path, opener: Opener = open_local) -> ModelInfo:
    """Describe the model in ``path`` from its header (a split model's: from all its parts' headers), read through
    ``opener`` (a local file by default; :mod:`llamafleet.model.hub` reads ranges of a file on the hub). Raises
    :class:`GgufError` with the reason if it cannot."""
    p = Path(path)
    meta, tensors, file_bytes = _read(p, opener)
    more, more_bytes = _split_tensors(p, meta, opener)
    tensors, file_bytes = tensors + more, file_bytes + more_bytes
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise GgufError(f"{p}: no 'general.architecture' in the header; is this a model (not a vocab-only) file?")
    if not tensors:
        raise GgufError(f"{p} holds no tensors (a vocab-only file?); give a model file")
    n_layer = _int(meta, f"{arch}.block_count", p)
    n_embd = _int(meta, f"{arch}.embedding_length", p)
    n_head = _int(meta, f"{arch}.attention.head_count", p)
    n_head_kv = _int(meta, f"{arch}.attention.head_count_kv", p, default=n_head)
    head_dim = _int(meta, f"{arch}.attention.key_length", p, default=n_embd // max(n_head, 1))
    head_dim_v = _int(meta, f"{arch}.attention.value_length", p, default=head_dim)
    layer_bytes = [0] * n_layer
    by_name = {t.name: t for t in tensors}
    types: dict[str, int] = {}
    for t in tensors:
        types[t.ggml_type] = types.get(t.ggml_type, 0) + t.n_bytes
        m = _BLOCK.match(t.name)
        if m and int(m.group(1)) < n_layer:
            layer_bytes[int(m.group(1))] += t.n_bytes
    embd = by_name.get("token_embd.weight")
    head = by_name.get("output.weight") or embd  # tied embeddings: llama.cpp places a copy as the head
    norm = by_name.get("output_norm.weight")
    n_vocab = embd.shape[1] if embd is not None and len(embd.shape) > 1 else _int(meta, f"{arch}.vocab_size", p, 0)
    weights = sum(t.n_bytes for t in tensors)
    name = meta.get("general.name")
    return ModelInfo(
        path=str(p),
        architecture=arch,
        name=name if isinstance(name, str) else p.stem,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        n_ff=_int(meta, f"{arch}.feed_forward_length", p, default=4 * n_embd),
        n_ctx_train=_int(meta, f"{arch}.context_length", p, default=0),
        n_vocab=n_vocab,
        file_type=_file_type(meta, tensors),
        weights_bytes=weights,
        layer_bytes=tuple(layer_bytes),
        non_layer_bytes=weights - sum(layer_bytes),
        input_bytes=embd.n_bytes if embd is not None else 0,
        output_bytes=(head.n_bytes if head is not None else 0) + (norm.n_bytes if norm is not None else 0),
        tied_embeddings="output.weight" not in by_name,
        file_bytes=file_bytes,
        n_tensors=len(tensors),
        n_params=sum(math.prod(t.shape) for t in tensors),
        tensor_types=tuple(sorted(types.items(), key=lambda kv: -kv[1])),
        reranker=meta.get(f"{arch}.pooling_type") == RANK_POOLING,
    )
