"""A LLaMA checkpoint folder as an F16 GGUF, written with the ``gguf`` package's writer: the same weights for both
engines, so ``llamafleet consistency`` can compare the torch engine with llama.cpp on one model.

Tensors are renamed to llama.cpp's names; the query and key projections are permuted from Hugging Face's rotary
layout (the two halves of each head rotated together) to llama.cpp's (adjacent pairs), as llama.cpp's own converter
does; matrices are stored in F16, norms in F32. The tokenizer is not converted: it is copied from a vocab GGUF
(``vocab``) that must be the checkpoint's own vocabulary, as it is for checkpoints ``llamafleet synth --hf`` writes;
the chat template is the checkpoint's.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType

from llamafleet.model.checkpoint import read_config, tensor_table, tokenizer_facts
from llamafleet.model.synth import Shape, vocab_fields, write_shape
from llamafleet.paths import partial_path

_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_name(name: str) -> str:
    """llama.cpp's name of a Hugging Face LLaMA tensor."""
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if name in fixed:
        return fixed[name]
    _, _, layer, rest = name.split(".", 3)  # model.layers.<i>.<module>.weight
    return f"blk.{layer}.{_NAMES[rest.removesuffix('.weight')]}.weight"


def rope_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a query/key projection from the rotate-half layout to llama.cpp's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def checkpoint_to_gguf(folder: str | Path, out: str | Path, vocab: Path) -> Path:
    """Write the checkpoint ``folder`` as an F16 GGUF ``out`` with the tokenizer of the vocab GGUF ``vocab``."""
    from safetensors import safe_open

    src = Path(folder)
    cfg = read_config(src)
    table = tensor_table(src)
    shape = Shape(src.name, n_layer=int(cfg["num_hidden_layers"]), n_embd=int(cfg["hidden_size"]),
                  n_head=int(cfg["num_attention_heads"]),
                  n_head_kv=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
                  n_ff=int(cfg["intermediate_size"]), n_ctx=int(cfg.get("max_position_embeddings") or 4096),
                  n_vocab=int(cfg["vocab_size"]), rope_base=float(cfg.get("rope_theta", 10000.0)))
    template = tokenizer_facts(src)["chat_template"]
    logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)
    target = Path(out)
    tmp = partial_path(target)
    writer = GGUFWriter(tmp, "llama")
    writer.add_name(f"{src.name} (converted from safetensors)")
    writer.add_file_type(int(LlamaFileType.MOSTLY_F16))
    write_shape(writer, shape, vocab_fields(vocab), template, rms_eps=float(cfg.get("rms_norm_eps", 1e-5)))
    for name in table:  # a tied checkpoint has no lm_head: llama.cpp then reads the embedding as the head
        with safe_open(str(src / table[name][2]), framework="pt") as f:
            w = f.get_tensor(name).float().numpy()
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            w = rope_permute(w, shape.n_head if "q_proj" in name else shape.n_head_kv)
        if w.ndim > 1:
            writer.add_tensor(gguf_name(name), w.astype(np.float16), raw_dtype=GGMLQuantizationType.F16)
        else:
            writer.add_tensor(gguf_name(name), w.astype(np.float32))
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, target)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return target
