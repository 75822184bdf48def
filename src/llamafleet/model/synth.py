"""Write LLaMA-2-shaped GGUF models with random weights and the real LLaMA-2 tokenizer.

They let users plan capacity before downloading 40 GB, and give GPU benchmarks a model where nothing can be
downloaded: decode speed depends on shapes and types, not on weight values. Weights are random quantization blocks
whose values have a standard deviation of about ``0.5 / sqrt(n_in)``, so activations stay finite through every
layer; norms are ones. Header and tensor table are written with the ``gguf`` package; the data is streamed in
blocks of a few tens of MB (a 7B Q4_0 file is written at disk speed). ``sparse=True`` writes the header and leaves
the data as a file hole: instant, no disk used, and the planner reads it like the real thing.

The tokenizer (``ggml-vocab-llama-spm.gguf``, vocab only) comes from llama.cpp's source inside the
llama-cpp-python sdist: see :func:`find_vocab`.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType
from tqdm import tqdm

from llamafleet.model.header import read_fields
from llamafleet.paths import LLAMA_CPP_VERSION, cache_dir, llama_cpp_sdist_dir

log = logging.getLogger(__name__)

VOCAB_NAME = "ggml-vocab-llama-spm.gguf"
VOCAB_MEMBER = f"llama_cpp_python-{LLAMA_CPP_VERSION}/vendor/llama.cpp/models/{VOCAB_NAME}"
CHUNK_BYTES = 32 << 20
# LLaMA-2 chat format ([INST] ... [/INST], the system prompt inside <<SYS>> tags in the first user turn).
CHAT_TEMPLATE = (
    "{% set sys = namespace(text='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set sys.text = m['content'] %}{% endif %}{% endfor %}"
    "{% set first = namespace(done=false) %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}{{ bos_token }}[INST] "
    "{% if not first.done and sys.text %}<<SYS>>\n{{ sys.text }}\n<</SYS>>\n\n{% endif %}"
    "{% set first.done = true %}{{ m['content'] | trim }} [/INST]"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] | trim }} {{ eos_token }}{% endif %}"
    "{% endfor %}"
)


class SynthError(RuntimeError):
    """Writing a synthetic model failed; the message says why and what to do."""


@dataclass(frozen=True)
class Shape:
    """The hyper-parameters of a LLaMA-2-style decoder."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int = 4096
    n_vocab: int = 32000

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


SHAPES: dict[str, Shape] = {
    "llama2-7b": Shape("llama2-7b", n_layer=32, n_embd=4096, n_head=32, n_head_kv=32, n_ff=11008),
    "llama2-13b": Shape("llama2-13b", n_layer=40, n_embd=5120, n_head=40, n_head_kv=40, n_ff=13824),
    "llama2-70b": Shape("llama2-70b", n_layer=80, n_embd=8192, n_head=64, n_head_kv=8, n_ff=28672),
    # Small enough for CPU tests, with grouped-query attention like 70B.
    "tiny": Shape("tiny", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_ctx=2048),
}
QUANTS: dict[str, tuple[GGMLQuantizationType, LlamaFileType]] = {
    "q4_0": (GGMLQuantizationType.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to write: ``ne`` in ggml order (row length first)."""

    name: str
    ne: tuple[int, ...]
    qtype: GGMLQuantizationType

    @property
    def n_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.qtype]
        return math.prod(self.ne) // block * size


def tensor_specs(shape: Shape, qtype: GGMLQuantizationType) -> list[TensorSpec]:
    """The tensors of a LLaMA model in llama.cpp's names; matrices in ``qtype``, norms in F32."""
    e, kv = shape.n_embd, shape.n_head_kv * shape.head_dim
    f32 = GGMLQuantizationType.F32
    specs = [TensorSpec("token_embd.weight", (e, shape.n_vocab), qtype)]
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        specs += [
            TensorSpec(b + "attn_norm.weight", (e,), f32),
            TensorSpec(b + "attn_q.weight", (e, e), qtype),
            TensorSpec(b + "attn_k.weight", (e, kv), qtype),
            TensorSpec(b + "attn_v.weight", (e, kv), qtype),
            TensorSpec(b + "attn_output.weight", (e, e), qtype),
            TensorSpec(b + "ffn_norm.weight", (e,), f32),
            TensorSpec(b + "ffn_gate.weight", (e, shape.n_ff), qtype),
            TensorSpec(b + "ffn_up.weight", (e, shape.n_ff), qtype),
            TensorSpec(b + "ffn_down.weight", (shape.n_ff, e), qtype),
        ]
    specs += [TensorSpec("output_norm.weight", (e,), f32), TensorSpec("output.weight", (e, shape.n_vocab), qtype)]
    return specs


def _random_chunks(spec: TensorSpec, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """The tensor's bytes, ``CHUNK_BYTES`` at a time: random values of std ~0.5/sqrt(row length)."""
    std = 0.5 / math.sqrt(spec.ne[0])
    total = spec.n_bytes
    if spec.qtype == GGMLQuantizationType.F32:  # norm weights
        yield np.ones(total // 4, dtype=np.float32).view(np.uint8)
        return
    block, size = GGML_QUANT_SIZES[spec.qtype]
    rows = max(1, CHUNK_BYTES // size)
    done = 0
    while done < total:
        n = min(rows, (total - done) // size)
        raw = rng.bit_generator.random_raw(-(-n * size // 8)).view(np.uint8)
        if spec.qtype == GGMLQuantizationType.F16:  # uniform int8 (std 73.9) times a scale, through a lookup table
            table = (np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float32) * (std / 73.9)).astype(np.float16)
            yield table[raw[:n]].view(np.uint8)
        else:
            blocks = raw[: n * size].reshape(n, size)
            # Q4_0 values are (nibble - 8) * d, std 4.61 d; Q8_0 values are int8 * d, std 73.9 d.
            d = std / (4.61 if spec.qtype == GGMLQuantizationType.Q4_0 else 73.9)
            blocks[:, :2] = np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)
            yield blocks.reshape(-1)
        done += n * size


def find_vocab(explicit: str | Path | None = None, fetch: bool = True) -> Path:
    """The LLaMA-2 tokenizer GGUF: ``explicit`` if given, else extracted (once, into the cache) from the sdist.

    The sdist is looked for in :func:`llamafleet.paths.llama_cpp_sdist_dir` and, if absent and ``fetch``, downloaded
    there with ``pip download``.
    """
    if explicit is not None:
        p = Path(explicit)
        if not p.is_file():
            raise SynthError(f"--vocab {p}: no such file; give the path of {VOCAB_NAME}")
        return p
    cached = cache_dir() / "vocab" / VOCAB_NAME
    if cached.is_file():
        return cached
    sdist = llama_cpp_sdist_dir() / f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"
    if not sdist.is_file():
        if not fetch:
            raise SynthError(f"the LLaMA-2 tokenizer needs {sdist} (or --vocab PATH to {VOCAB_NAME})")
        _fetch_sdist(sdist.parent)
    try:
        with tarfile.open(sdist) as tar:
            member = tar.extractfile(VOCAB_MEMBER)
            if member is None:
                raise KeyError(VOCAB_MEMBER)
            data = member.read()
    except (KeyError, tarfile.TarError) as e:
        raise SynthError(f"{sdist} does not hold {VOCAB_MEMBER} ({e}); delete it to fetch it again") from None
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".partial")
    tmp.write_bytes(data)
    os.replace(tmp, cached)
    return cached


def _fetch_sdist(folder: Path) -> None:
    log.warning("fetching the llama-cpp-python %s sdist into %s for the LLaMA-2 tokenizer", LLAMA_CPP_VERSION, folder)
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(folder),
           f"llama-cpp-python=={LLAMA_CPP_VERSION}"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SynthError(
            f"could not download the llama-cpp-python sdist ({' '.join(cmd)} failed: {done.stderr.strip()[-500:]}).\n"
            f"Copy llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz into {folder}, or pass --vocab PATH to {VOCAB_NAME}"
        )


def _copy_tokenizer(writer: GGUFWriter, vocab: Path) -> None:
    fields = read_fields(vocab, "tokenizer.")
    if "tokenizer.ggml.tokens" not in fields:
        raise SynthError(f"{vocab} has no tokenizer.ggml.tokens; give the LLaMA-2 vocab file {VOCAB_NAME}")
    for key, field in fields.items():
        writer.add_key_value(key, field.value, field.vtype, sub_type=field.sub_type)


def write_model(
    out: str | Path,
    shape: Shape,
    quant: str,
    vocab: Path,
    *,
    sparse: bool = False,
    seed: int = 0,
    progress: bool = True,
    chat_template: str = CHAT_TEMPLATE,
    fim: tuple[int, int, int] | None = None,
) -> Path:
    """Write a random-weight model of ``shape`` in ``quant`` (q4_0, q8_0, f16) to ``out``; returns the path.
    ``chat_template``: the Jinja chat template it carries (LLaMA-2's unless given). ``fim``: token ids to name as
    its fill-in-the-middle prefix, suffix and middle tokens (the LLaMA-2 vocabulary has none of its own).

    The file appears only when complete (written under a temporary name, then renamed).
    """
    if quant not in QUANTS:
        raise SynthError(f"unknown quant {quant!r}; use one of {', '.join(QUANTS)}")
    qtype, ftype = QUANTS[quant]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    specs = tensor_specs(shape, qtype)
    # the gguf package announces every file it writes at INFO ("for Little Endian only", tensor counts): our own
    # progress bar and summary say what matters
    logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)
    writer = GGUFWriter(tmp, "llama")
    writer.add_name(f"llamafleet synthetic {shape.name} {quant}")
    writer.add_description("random weights written by `llamafleet synth`: for planning and speed tests only")
    writer.add_file_type(int(ftype))
    if qtype != GGMLQuantizationType.F16:
        writer.add_quantization_version(2)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.n_vocab)
    _copy_tokenizer(writer, vocab)
    writer.add_chat_template(chat_template)
    for part, token in zip(("pre", "suf", "mid"), fim or (), strict=False):
        writer.add_uint32(f"tokenizer.ggml.fim_{part}_token_id", token)
    for s in specs:
        writer.add_tensor_info(s.name, tuple(reversed(s.ne)), np.dtype(np.float32), s.n_bytes, raw_dtype=s.qtype)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        f = writer.fout[0]
        writer.write_padding(f, f.tell())
        if sparse:
            f.truncate(f.tell() + sum(GGUFWriter.ggml_pad(s.n_bytes, writer.data_alignment) for s in specs))
        else:
            _write_data(f, writer, specs, seed, progress)
        writer.close()
        os.replace(tmp, out)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return out


def _write_data(f: BinaryIO, writer: GGUFWriter, specs: list[TensorSpec], seed: int, progress: bool) -> None:
    rng = np.random.Generator(np.random.SFC64(seed))
    total = sum(s.n_bytes for s in specs)
    with tqdm(total=total, unit="B", unit_scale=True, desc="writing weights", disable=not progress) as bar:
        for s in specs:
            for chunk in _random_chunks(s, rng):
                f.write(chunk.data)
                bar.update(chunk.nbytes)
            writer.write_padding(f, s.n_bytes)
