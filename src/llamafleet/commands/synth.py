"""``llamafleet synth``: write a LLaMA-2-shaped GGUF with random weights and the real LLaMA-2 tokenizer."""

from __future__ import annotations

import argparse

from llamafleet.model.synth import QUANTS, SHAPES, SynthError, find_vocab, write_model


def _run(args: argparse.Namespace) -> int:
    try:
        vocab = find_vocab(args.vocab)
        path = write_model(args.output, SHAPES[args.shape], args.quant, vocab, sparse=args.sparse, seed=args.seed,
                           progress=not args.quiet)
    except SynthError as e:
        print(f"error: {e}")
        return 1
    except OSError as e:
        print(f"error: cannot write {args.output}: {e}")
        return 1
    size = path.stat().st_size / 2**30
    print(f"{path} ({size:.2f} GiB{', sparse: no data written' if args.sparse else ''})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "synth",
        help="write a LLaMA-2-shaped GGUF with random weights (for planning and speed tests)",
        description="Write a LLaMA-2-shaped model with random weights that llama.cpp loads and runs, with the real "
        "LLaMA-2 tokenizer. Its answers are noise; its speed and memory are those of the real model.",
    )
    p.add_argument("--shape", choices=sorted(SHAPES), required=True, help="model shape")
    p.add_argument("--quant", choices=sorted(QUANTS), default="q4_0", help="weight type (default q4_0)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the .gguf")
    p.add_argument("--sparse", action="store_true",
                   help="write only the header and leave the weights as a file hole (instant; for planning only)")
    p.add_argument("--vocab", metavar="PATH", help="ggml-vocab-llama-spm.gguf (default: from the llama-cpp-python "
                   "sdist, fetched if absent)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
