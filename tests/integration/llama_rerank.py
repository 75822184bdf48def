"""The reference reranker for the tests: llama-cpp-python's low-level calls score each query-document pair alone, in a
context of its own with llama.cpp's rank pooling, the pair laid out the way llama-server's ``format_prompt_rerank``
lays it (the GGUF's ``rerank`` template, else ``[BOS] query [EOS] [SEP] document [EOS]`` by the vocabulary's add
flags). llamafleet's bindings are not used here."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp as lc


def _tokenize(vocab: lc.llama_vocab_p, text: str, parse_special: bool) -> list[int]:
    raw = text.encode()
    arr = (lc.llama_token * (len(raw) + 8))()
    n = lc.llama_tokenize(vocab, raw, len(raw), arr, len(arr), False, parse_special)
    assert n >= 0
    return list(arr[:n])


def pair_tokens(model: lc.llama_model_p, query: str, document: str) -> list[int]:
    vocab = lc.llama_model_get_vocab(model)
    template = lc.llama_model_chat_template(model, b"rerank")
    if template:
        text = template.decode().replace("{query}", query).replace("{document}", document)
        return _tokenize(vocab, text, parse_special=True)
    eos = lc.llama_vocab_eos(vocab)
    if eos < 0:
        eos = lc.llama_vocab_sep(vocab)
    add_eos = [eos] if lc.llama_vocab_get_add_eos(vocab) else []
    out = [lc.llama_vocab_bos(vocab)] if lc.llama_vocab_get_add_bos(vocab) else []
    out += _tokenize(vocab, query, False) + add_eos
    out += [lc.llama_vocab_sep(vocab)] if lc.llama_vocab_get_add_sep(vocab) else []
    return out + _tokenize(vocab, document, False) + add_eos


def scores(path: Path, query: str, documents: list[str]) -> tuple[list[float], list[list[int]]]:
    """Each pair's relevance score (the first of its classifier's outputs) and its tokens."""
    mp = lc.llama_model_default_params()
    model = lc.llama_model_load_from_file(str(path).encode(), mp)
    assert model
    p = lc.llama_context_default_params()
    p.embeddings, p.pooling_type = True, lc.LLAMA_POOLING_TYPE_RANK
    p.n_ctx = p.n_batch = p.n_ubatch = 512
    p.n_threads = p.n_threads_batch = 1
    ctx = lc.llama_init_from_model(model, p)
    assert ctx
    batch = lc.llama_batch_init(512, 0, 1)
    out, pairs = [], []
    try:
        for doc in documents:
            tokens = pair_tokens(model, query, doc)
            pairs.append(tokens)
            batch.n_tokens = len(tokens)
            for i, t in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, True
                batch.seq_id[i][0] = 0
            memory = lc.llama_get_memory(ctx)
            if memory:
                lc.llama_memory_clear(memory, True)
            assert lc.llama_decode(ctx, batch) == 0
            ptr = lc.llama_get_embeddings_seq(ctx, 0)
            out.append(float(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))[0]))
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
        lc.llama_model_free(model)
    return out, pairs
