"""Write a tiny BERT-architecture embedding model or reranker (random weights, a small WordPiece vocabulary) that
llama.cpp loads.

Embedding models are encoders: attention both ways, a learned position table, their own pooling named in the file
(``bert.pooling_type``), a WordPiece ("bert") tokenizer with ``[CLS] ... [SEP]`` around every input. This writes one
small enough for tests (a few hundred kB) with exactly the tensors and keys llama.cpp's BERT loader reads, so the
embedding path is tested on the real loader and graph without downloading a model. Its vectors mean nothing beyond
being a fixed function of the text: equal texts give equal vectors, different texts different ones.

A reranker (``pooling=RANK``) is the same encoder with a classification head on its ``[CLS]`` state, as llama.cpp
reads a cross-encoder's: ``cls`` (a dense layer, tanh) then ``cls.output`` (one score); its pooling type is ``rank``.
With ``rerank_template`` it carries a ``rerank`` template too (``{query}`` and ``{document}`` in it), which llama.cpp's
rerankers use instead of the plain ``[CLS] query [SEP] document`` layout.

The vocabulary: the five special tokens, every lowercase letter and digit both as a word start (WordPiece's "▁"
prefix, as llama.cpp's converter writes it) and as a continuation, and a few whole words.
"""

from __future__ import annotations

import math
import string
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, PoolingType, TokenType

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "cat", "dog", "sat", "on", "mat", "hello", "world", "is"]


def vocabulary() -> list[str]:
    chars = string.ascii_lowercase + string.digits
    return SPECIAL + ["\u2581" + c for c in chars] + list(chars) + ["\u2581" + w for w in WORDS] + ["\u2581."]


def write_bert(out: str | Path, *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, n_ff: int = 128,
               n_ctx: int = 128, pooling: PoolingType = PoolingType.MEAN, seed: int = 0,
               rerank_template: str | None = None) -> Path:
    """Write the model to ``out`` (F32, random weights of std ``0.5 / sqrt(n_in)``, norms of one); returns the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocab = vocabulary()

    def matrix(n_out: int, n_in: int) -> np.ndarray:
        return rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(0.5 / math.sqrt(n_in))

    def norm(prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}.weight": np.ones(n_embd, np.float32), f"{prefix}.bias": np.zeros(n_embd, np.float32)}

    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": matrix(len(vocab), n_embd),
        "token_types.weight": matrix(2, n_embd),
        "position_embd.weight": matrix(n_ctx, n_embd),
        **norm("token_embd_norm"),
    }
    for i in range(n_layer):
        b = f"blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors[b + name + ".weight"] = matrix(n_embd, n_embd)
            tensors[b + name + ".bias"] = np.zeros(n_embd, np.float32)
        tensors |= norm(b + "attn_output_norm") | norm(b + "layer_output_norm")
        tensors |= {b + "ffn_up.weight": matrix(n_ff, n_embd), b + "ffn_up.bias": np.zeros(n_ff, np.float32),
                    b + "ffn_down.weight": matrix(n_embd, n_ff), b + "ffn_down.bias": np.zeros(n_embd, np.float32)}
    if pooling == PoolingType.RANK:  # the classifier head: dense + tanh, then one score (random biases: nonzero)
        tensors |= {"cls.weight": matrix(n_embd, n_embd), "cls.bias": matrix(1, n_embd)[0],
                    "cls.output.weight": matrix(1, n_embd), "cls.output.bias": np.ones(1, np.float32) * 0.1}

    w = GGUFWriter(out, "bert")
    w.add_name("llamafleet synthetic bert")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(pooling)
    if rerank_template is not None:
        w.add_string("tokenizer.chat_template.rerank", rerank_template)
    w.add_tokenizer_model("bert")
    w.add_token_list(vocab)
    w.add_token_types([TokenType.CONTROL if t in SPECIAL else TokenType.NORMAL for t in vocab])
    w.add_token_type_count(2)
    for add, token in ((w.add_pad_token_id, "[PAD]"), (w.add_unk_token_id, "[UNK]"), (w.add_bos_token_id, "[CLS]"),
                       (w.add_sep_token_id, "[SEP]"), (w.add_mask_token_id, "[MASK]")):
        add(vocab.index(token))
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
