"""Write LLaMA-shaped GGUF models (LLaMA-2, Llama-3) with random weights and the real tokenizer.

They let users plan capacity before downloading 40 GB, and give GPU benchmarks a model where nothing can be
downloaded: decode speed depends on shapes and types, not on weight values. Weights are random quantization blocks
whose values have a standard deviation of about ``0.5 / sqrt(n_in)``, so activations stay finite through every
layer; norms are ones. Header and tensor table are written with the ``gguf`` package; the data is streamed in
blocks of a few tens of MB (a 7B Q4_0 file is written at disk speed). ``sparse=True`` writes the header and leaves
the data as a file hole: instant, no disk used, and the planner reads it like the real thing.

The tokenizer (``ggml-vocab-llama-spm.gguf``, vocab only) comes from llama.cpp's source inside the
llama-cpp-python sdist: see :func:`find_vocab`. That source holds other real tokenizers (``qwen2``, ``qwen35``,
``llama-bpe``, ``deepseek-llm``, ...) and about 70 real chat templates; ``vocab`` and ``chat_template`` take them by
name (or a file), so a test model tokenizes and renders its prompts exactly as the real model of that family would
(the matrix of model families, docs/MODELS.md, is tested on such models).
"""

from __future__ import annotations

import dataclasses
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

from llamafleet.model.header import MetaField, read_fields
from llamafleet.paths import LLAMA_CPP_VERSION, cache_dir, llama_cpp_sdist_dir, partial_path

log = logging.getLogger(__name__)

VOCAB_NAME = "ggml-vocab-llama-spm.gguf"
VENDOR = f"llama_cpp_python-{LLAMA_CPP_VERSION}/vendor/llama.cpp/"
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
    """The hyper-parameters of a LLaMA-style decoder. ``vocab`` and ``template`` name the real model's tokenizer and
    chat template in llama.cpp's source (:func:`find_vocab`, :func:`find_template`), where it is not LLaMA-2's."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int = 4096
    n_vocab: int = 32000
    rope_base: float = 10000.0
    vocab: str | None = None
    template: str | None = None

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


SHAPES: dict[str, Shape] = {
    "llama2-7b": Shape("llama2-7b", n_layer=32, n_embd=4096, n_head=32, n_head_kv=32, n_ff=11008),
    "llama2-13b": Shape("llama2-13b", n_layer=40, n_embd=5120, n_head=40, n_head_kv=40, n_ff=13824),
    "llama2-70b": Shape("llama2-70b", n_layer=80, n_embd=8192, n_head=64, n_head_kv=8, n_ff=28672),
    # Grouped-query attention (8 KV heads): a quarter of LLaMA-2 7B's KV per token, 128 KiB in f16.
    "llama3-8b": Shape("llama3-8b", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_ctx=8192,
                       n_vocab=128256, rope_base=500000.0, vocab="llama-bpe",
                       template="meta-llama-Llama-3.1-8B-Instruct"),
    # Small enough for CPU tests, with grouped-query attention like 70B.
    "tiny": Shape("tiny", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_ctx=2048),
    # The least that runs: for tests of what surrounds the model (templates, tokenizers, parsing) with large vocabs.
    "micro": Shape("micro", n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128, n_ctx=2048),
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


def vendored(member: str, fetch: bool = True) -> Path:
    """A file of llama.cpp's source in the llama-cpp-python sdist (``member`` relative to ``vendor/llama.cpp/``),
    from the cache. The first file asked for brings every tokenizer and chat template of ``models/`` there in one
    pass over the sdist (a gzip stream is read from its start for every member taken). The sdist is looked for in
    :func:`llamafleet.paths.llama_cpp_sdist_dir` and, if absent and ``fetch``, downloaded there with ``pip
    download``."""
    folder = cache_dir() / "vendor"
    if not (folder / member).is_file():
        _extract_models(folder, fetch)
    if not (folder / member).is_file():
        raise SynthError(f"llama.cpp's source has no {member}; check the name")
    return folder / member


def _extract_models(folder: Path, fetch: bool) -> None:
    sdist = llama_cpp_sdist_dir() / f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"
    if not sdist.is_file():
        if not fetch:
            raise SynthError(f"tokenizers and chat templates are taken from {sdist}, which is not there (or give "
                             "--vocab PATH / --chat-template FILE)")
        _fetch_sdist(sdist.parent)
    try:
        with tarfile.open(sdist) as tar:
            for info in tar:
                name = info.name.removeprefix(VENDOR)
                if name != info.name and name.startswith("models/") and name.endswith((".jinja", ".gguf")):
                    data = tar.extractfile(info)
                    if data is not None:
                        target = folder / name
                        target.parent.mkdir(parents=True, exist_ok=True)
                        tmp = partial_path(target)
                        tmp.write_bytes(data.read())
                        os.replace(tmp, target)
    except tarfile.TarError as e:
        raise SynthError(f"{sdist} cannot be read ({e}); delete it to fetch it again") from None


def find_vocab(explicit: str | Path | None = None, fetch: bool = True) -> Path:
    """A tokenizer GGUF: ``explicit`` if it is a file, else the sdist's ``ggml-vocab-<explicit>.gguf`` (``qwen2``,
    ``llama-bpe``, ...), else the LLaMA-2 one (:func:`vendored`)."""
    if explicit is not None and Path(explicit).is_file():
        return Path(explicit)
    if explicit is not None and (os.sep in str(explicit) or str(explicit).endswith(".gguf")):
        raise SynthError(f"--vocab {explicit}: no such file; give a tokenizer GGUF or a name such as qwen2")
    return vendored(f"models/ggml-vocab-{explicit}.gguf" if explicit else f"models/{VOCAB_NAME}", fetch)


def find_template(explicit: str | Path) -> str:
    """A chat template's Jinja source: the file ``explicit``, else the sdist's ``models/templates/<explicit>.jinja``
    (``Qwen-Qwen3-0.6B``, ``openai-gpt-oss-120b``, ...)."""
    if Path(explicit).is_file():
        return Path(explicit).read_text(encoding="utf-8")
    if os.sep in str(explicit) or str(explicit).endswith(".jinja"):
        raise SynthError(f"--chat-template {explicit}: no such file; give a Jinja file or the name of one of "
                         "llama.cpp's templates (models/templates/NAME.jinja)")
    return vendored(f"models/templates/{explicit}.jinja").read_text(encoding="utf-8")


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


def _copy_tokenizer(writer: GGUFWriter, fields: dict[str, MetaField]) -> None:
    for key, field in fields.items():
        if not key.startswith("tokenizer.chat_template"):  # the model's own template is written apart
            writer.add_key_value(key, field.value, field.vtype, sub_type=field.sub_type)


def vocab_fields(vocab: Path) -> dict[str, MetaField]:
    fields = read_fields(vocab, "tokenizer.")
    if "tokenizer.ggml.tokens" not in fields:
        raise SynthError(f"{vocab} has no tokenizer.ggml.tokens; give a tokenizer GGUF such as {VOCAB_NAME}")
    return fields


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
    ``chat_template``: the Jinja chat template it carries (LLaMA-2's unless given). The vocabulary's size is the
    tokenizer's (``shape.n_vocab`` is the real model's). ``fim``: token ids to name as its fill-in-the-middle prefix,
    suffix and middle tokens (the LLaMA-2 vocabulary has none of its own).

    The file appears only when complete (written under a temporary name, then renamed).
    """
    if quant not in QUANTS:
        raise SynthError(f"unknown quant {quant!r}; use one of {', '.join(QUANTS)}")
    qtype, ftype = QUANTS[quant]
    tokenizer = vocab_fields(vocab)
    tokens = tokenizer["tokenizer.ggml.tokens"].value
    shape = dataclasses.replace(shape, n_vocab=len(tokens) if isinstance(tokens, list) else shape.n_vocab)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(out)
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
    write_shape(writer, shape, tokenizer, chat_template)
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


def write_shape(writer: GGUFWriter, shape: Shape, tokenizer: dict[str, MetaField], chat_template: str,
                rms_eps: float = 1e-5) -> None:
    """A LLaMA model's hyper-parameters, its tokenizer (the fields of a vocab GGUF) and chat template."""
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_layer_norm_rms_eps(rms_eps)
    writer.add_vocab_size(shape.n_vocab)
    _copy_tokenizer(writer, tokenizer)
    writer.add_chat_template(chat_template)


def _write_data(f: BinaryIO, writer: GGUFWriter, specs: list[TensorSpec], seed: int, progress: bool) -> None:
    rng = np.random.Generator(np.random.SFC64(seed))
    total = sum(s.n_bytes for s in specs)
    with tqdm(total=total, unit="B", unit_scale=True, desc="writing weights", disable=not progress) as bar:
        for s in specs:
            for chunk in _random_chunks(s, rng):
                f.write(chunk.data)
                bar.update(chunk.nbytes)
            writer.write_padding(f, s.n_bytes)
