"""``llamafleet synth``: write a LLaMA-shaped GGUF with random weights and a real tokenizer and chat template (by
default the real model's: LLaMA-2's, or Llama-3's for ``llama3-8b``).

The writer (:mod:`llamafleet.model.synth`) imports numpy and gguf, so its shape and weight-type names are read only
when synth's own arguments are parsed or shown (:class:`_Names`), never when the parser is built for another
command.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from collections.abc import Iterator


class _Names:
    """argparse ``choices`` taken from a mapping in :mod:`llamafleet.model.synth` on first use."""

    def __init__(self, attr: str, extra: tuple[str, ...] = ()) -> None:
        self.attr = attr
        self.extra = extra

    def _names(self) -> list[str]:
        return sorted(getattr(importlib.import_module("llamafleet.model.synth"), self.attr)) + list(self.extra)

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())


BERT_POOLING = ("mean", "cls", "rank")  # --bert: an embedding model's pooling, or a reranker's
HF_DTYPES = ("f32", "f16", "bf16")


def run(args: argparse.Namespace) -> int:
    from llamafleet.model.synth import CHAT_TEMPLATE, QUANTS, SHAPES, SynthError, find_template, find_vocab, write_model

    if args.bert is not None:
        return _bert(args)
    if args.lora_for is not None:
        return _lora(args)
    if args.shape is None:
        print("error: give --shape (a LLaMA-shaped model), --bert (a tiny encoder) or --lora-for (an adapter)",
              file=sys.stderr)
        return 2
    if args.hf and (args.quant not in HF_DTYPES or args.sparse):
        print(f"error: --hf writes {'/'.join(HF_DTYPES)} weights (--quant), never sparse", file=sys.stderr)
        return 1
    if not args.hf and args.quant not in QUANTS:
        print(f"error: --quant {args.quant} is for --hf checkpoints; a GGUF takes {', '.join(QUANTS)}",
              file=sys.stderr)
        return 1
    if args.ctx_train is not None and args.ctx_train < 1:
        print(f"error: --ctx-train {args.ctx_train}: the trained context is a number of tokens, 1 or more",
              file=sys.stderr)
        return 1
    shape = SHAPES[args.shape]
    if args.ctx_train is not None:
        shape = dataclasses.replace(shape, n_ctx=args.ctx_train)
    try:
        vocab = find_vocab(args.vocab or shape.vocab)
        template_name = args.chat_template or shape.template
        template = CHAT_TEMPLATE if template_name is None else find_template(template_name)
        if args.hf:
            from llamafleet.model.synth_hf import write_checkpoint

            folder = write_checkpoint(args.output, shape, args.quant, vocab, template, seed=args.seed)
            size = sum(f.stat().st_size for f in folder.iterdir()) / 2**30
            print(f"{folder} ({size:.2f} GiB, a checkpoint folder for the torch engine)")
            return 0
        path = write_model(args.output, shape, args.quant, vocab, sparse=args.sparse, seed=args.seed,
                           progress=not args.quiet, chat_template=template)
    except SynthError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: cannot write {args.output}: {e}", file=sys.stderr)
        return 1
    size = path.stat().st_size / 2**30
    print(f"{path} ({size:.2f} GiB{', sparse: no data written' if args.sparse else ''})")
    return 0


def _bert(args: argparse.Namespace) -> int:
    from gguf import PoolingType

    from llamafleet.model.synth_bert import write_bert

    try:
        path = write_bert(args.output, pooling=PoolingType[args.bert.upper()], seed=args.seed)
    except OSError as e:
        print(f"error: cannot write {args.output}: {e}", file=sys.stderr)
        return 1
    print(f"{path} (a tiny BERT {'reranker' if args.bert == 'rank' else 'embedding model'})")
    return 0


def _lora(args: argparse.Namespace) -> int:
    from llamafleet.model.header import GgufError
    from llamafleet.model.synth_lora import write_lora

    try:
        path = write_lora(args.lora_for, args.output, rank=args.rank, seed=args.seed)
    except (GgufError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{path} (a LoRA adapter of rank {args.rank} for {args.lora_for})")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "synth",
        help="write a LLaMA-shaped GGUF with random weights (for planning and speed tests)",
        description="Write a LLaMA-2- or Llama-3-shaped model with random weights that llama.cpp loads and runs, with "
        "the real model's tokenizer. Its answers are noise; its speed and memory are those of the real model.",
    )
    # a metavar keeps argparse from listing the choices (and importing the writer) while the parser is built
    p.add_argument("--shape", choices=_Names("SHAPES"), metavar="SHAPE",
                   help="model shape: %(choices)s (or --bert, or --lora-for)")
    p.add_argument("--bert", choices=BERT_POOLING, help="write a tiny BERT encoder with random weights instead: an "
                   "embedding model pooled by mean or cls, or a reranker (rank: a classifier head, for /v1/rerank)")
    p.add_argument("--quant", choices=_Names("QUANTS", ("f32", "bf16")), default="q4_0", metavar="TYPE",
                   help="weight type: %(choices)s (default %(default)s; f32 and bf16 with --hf only)")
    p.add_argument("--ctx-train", type=int, metavar="TOKENS", help="the context length the model says it was "
                   "trained on (default: the shape's, 4,096 for the LLaMA-2 shapes, 8,192 for llama3-8b); llama-server "
                   "caps a slot at it")
    p.add_argument("--hf", action="store_true", help="write a Hugging Face checkpoint folder (config.json, "
                   "safetensors in f32/f16/bf16, tokenizer.json) for the torch engine instead of a GGUF; needs the "
                   "torch extra's transformers for the tokenizer")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the .gguf (the folder, "
                   "with --hf)")
    p.add_argument("--sparse", action="store_true",
                   help="write only the header and leave the weights as a file hole (instant; for planning only)")
    p.add_argument("--vocab", metavar="PATH|NAME", help="the tokenizer: a vocab GGUF, or the name of one in "
                   "llama.cpp's source (qwen2, qwen35, llama-bpe, deepseek-llm, phi-3, ...; from the llama-cpp-python "
                   "sdist, fetched if absent); default: the shape's own (llama-bpe for llama3-8b, else LLaMA-2's "
                   "llama-spm)")
    p.add_argument("--chat-template", metavar="FILE|NAME", help="the chat template: a Jinja file, or the name of one "
                   "of llama.cpp's (Qwen-Qwen3-0.6B, meta-llama-Llama-3.1-8B-Instruct, ...); default: the shape's own "
                   "(Llama-3.1's for llama3-8b, else LLaMA-2's)")
    p.add_argument("--lora-for", metavar="BASE.gguf", help="write a LoRA adapter with random weights for the model "
                   "file BASE instead (its attention query and value projections)")
    p.add_argument("--rank", type=int, default=8, help="the adapter's rank, with --lora-for (default 8)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
