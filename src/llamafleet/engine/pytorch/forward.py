"""A LLaMA checkpoint's forward pass over slot-indexed KV buffers: continuous batching's memory.

``transformers`` loads the checkpoint (``LlamaForCausalLM``: its modules, weights, rotary embedding); the pass
through its layers is driven here so that each running sequence keeps its own place in one preallocated KV buffer per
layer (``[slots, kv_heads, n_ctx_per_seq, head_dim]``), sequences join and leave between steps, and one step decodes
every running answer in one batched pass whatever their lengths: each row writes its new key and value at its own
position and attends to its own slot's first positions only (a mask per row). A prompt is prefilled in chunks, one
pass per chunk. Nothing is padded or copied when a sequence joins or leaves; a finished slot is simply overwritten.
Each slot has one position more than its context, never attended to: where the padding rows of a decode step in
fixed shapes write (:mod:`.graphs`).

Devices: the whole model on one device (the CPU, or GPU 0 of those the worker sees), or, for a layer split, each
layer on the GPU :func:`~llamafleet.engine.devices.layer_devices` gives it (the planner's rule for GGUF replicas),
the embedding with the first layer and the norm and head with the last; the hidden state moves between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from llamafleet.engine.devices import layer_devices
from llamafleet.engine.types import EngineConfig

GPU_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def pick_dtype(stored: str | None, gpu: bool) -> torch.dtype:
    """The dtype the weights (and the KV cache) are held in: on a GPU fp16/bf16 as stored (fp32 -> bf16), on the
    CPU fp32 and bf16 as stored (fp16, slow on CPUs, -> bf16)."""
    if gpu:
        return GPU_DTYPES.get(stored or "", torch.bfloat16)
    return torch.float32 if stored in (None, "float32") else torch.bfloat16


@dataclass
class Group:
    """One pass: ``tokens`` ``[B, T]`` of the sequences in ``slots`` at positions ``start[b]`` on, on the model's
    first device; ``n_keys``: the positions the pass attends to (its last row's end at most), known without reading
    anything back from the device."""

    tokens: torch.Tensor
    slots: torch.Tensor
    start: torch.Tensor
    n_keys: int

    @classmethod
    def of(cls, tokens: list[list[int]], slots: list[int], start: list[int], device: torch.device) -> Group:
        packed = torch.tensor([[s, p, *t] for t, s, p in zip(tokens, slots, start, strict=True)], device=device)
        return cls(packed[:, 2:], packed[:, 0], packed[:, 1], max(start) + len(tokens[0]))  # one copy to the device


@dataclass(frozen=True)
class Parts:
    """A decoder layer's modules, looked up once: ``nn.Module``'s attribute lookup costs microseconds each, some
    ten per layer in every pass."""

    norm1: Any
    q: Any
    k: Any
    v: Any
    o: Any
    scaling: float
    norm2: Any
    mlp: Any

    @classmethod
    def of(cls, layer: Any) -> Parts:
        a = layer.self_attn
        return cls(layer.input_layernorm, a.q_proj, a.k_proj, a.v_proj, a.o_proj, a.scaling,
                   layer.post_attention_layernorm, layer.mlp)


class SlotModel:
    """The checkpoint in ``cfg.model_path`` loaded for ``cfg.n_seq`` slots of ``cfg.n_ctx_per_seq`` tokens."""

    def __init__(self, cfg: EngineConfig) -> None:
        from transformers import AutoConfig, LlamaForCausalLM

        conf = AutoConfig.from_pretrained(cfg.model_path, trust_remote_code=False)
        if conf.model_type != "llama":
            raise ValueError(f"{cfg.model_path}: model_type {conf.model_type!r}; the torch engine runs LLaMA only")
        gpus = torch.cuda.device_count() if cfg.n_gpu_layers != 0 else 0
        stored = getattr(conf, "dtype", None) or getattr(conf, "torch_dtype", None)
        self.dtype = pick_dtype(str(stored).removeprefix("torch.") if stored is not None else None, gpus > 0)
        net = LlamaForCausalLM.from_pretrained(cfg.model_path, dtype=self.dtype, trust_remote_code=False)
        net.train(False)
        self.config = conf
        n_layer = conf.num_hidden_layers
        ratios = cfg.tensor_split if cfg.split_mode == "layer" and len(cfg.tensor_split) > 1 else (1.0,)
        where = layer_devices(n_layer, ratios[:gpus] if gpus else ())
        self.devices = [torch.device(f"cuda:{d}") if gpus else torch.device("cpu") for d in where]
        self.inner = net.model
        self.layers = list(net.model.layers)
        for layer, dev in zip(self.layers, self.devices, strict=False):
            layer.to(dev)
        self.parts = [Parts.of(layer) for layer in self.layers]
        first, last = self.devices[0], self.devices[-1]
        self.inner.embed_tokens.to(first)
        self.inner.rotary_emb.to(first)
        self.inner.norm.to(last)
        # a tied head is the embedding itself: it stays with the embedding (the hidden state comes to it)
        self.head = net.lm_head if conf.tie_word_embeddings else net.lm_head.to(last)
        self.n_slots, self.n_ctx = cfg.n_seq, cfg.n_ctx_per_seq
        self.head_dim = int(getattr(conf, "head_dim", None) or conf.hidden_size // conf.num_attention_heads)
        n_kv = conf.num_key_value_heads or conf.num_attention_heads
        shape = (cfg.n_seq, n_kv, cfg.n_ctx_per_seq + 1, self.head_dim)  # + the spare position
        self.k = [torch.zeros(shape, dtype=self.dtype, device=dev) for dev in self.devices[:n_layer]]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=dev) for dev in self.devices[:n_layer]]
        self.device = first

    def allocated_bytes(self) -> tuple[int, int]:
        """Bytes of the weights and of the KV buffers, as allocated."""
        mods = [*self.layers, self.inner.embed_tokens, self.inner.norm, self.head]
        seen: set[int] = set()
        weights = 0
        for m in mods:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    weights += p.numel() * p.element_size()
        return weights, sum(t.numel() * t.element_size() for t in self.k + self.v)

    def close(self) -> None:
        self.k.clear()
        self.v.clear()
        self.layers.clear()
        self.parts.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    @torch.inference_mode()
    def forward(self, g: Group, last: list[int] | None = None) -> torch.Tensor:
        """Run the pass ``g`` (its keys and values written into its slots); float32 logits ``[B, vocab]`` of each
        row's token ``last[b]`` (default: its last; rows padded at the end name their last real token: what the
        padding writes into the slot lies past it, masked, and is overwritten by the slot's next token)."""
        b, t = g.tokens.shape
        pos = g.start[:, None] + torch.arange(t, device=g.start.device)[None, :]  # [B, T]
        h = self._layers(g.tokens, g.slots, pos, g.n_keys, False)
        h = h[:, -1] if last is None else h[torch.arange(b, device=h.device), torch.tensor(last, device=h.device)]
        return self._logits(h)

    def decode_eager(self, tokens: list[int], slots: list[int], pos: list[int]) -> torch.Tensor:
        """One token per row, in the pass's own shapes: logits ``[B, vocab]``."""
        return self.forward(Group.of([[t] for t in tokens], slots, pos, self.device))

    def decode(self, tokens: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor, n_keys: int,
               every_slot: bool) -> torch.Tensor:
        """One token per row (``tokens``, ``slots``, ``pos``: ``[B]``), attending to the first ``n_keys`` positions
        of its slot: logits ``[B, vocab]``. Only tensor operations of shapes fixed by ``B`` and ``n_keys`` (what a
        CUDA graph can capture). ``every_slot``: row ``i`` is slot ``i`` (``B`` is the slot count), and attention
        reads the KV buffers in place instead of gathering the rows' slots."""
        h = self._layers(tokens[:, None], slots, pos[:, None], n_keys, every_slot)
        return self._logits(h[:, -1])

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        h = self.inner.norm(h.to(self.devices[-1]))
        out: torch.Tensor = self.head(h.to(self.head.weight.device)).float()
        return out

    def _layers(self, tokens: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor, n_keys: int,
                every_slot: bool) -> torch.Tensor:
        """The hidden states ``[B, T, hidden]`` after the last layer."""
        keys = torch.arange(n_keys, device=pos.device)
        mask = keys[None, None, None, :] <= pos[:, None, :, None]  # [B, 1, T, L]: each row sees its own past
        h = self.inner.embed_tokens(tokens.to(self.device))
        cos, sin = self.inner.rotary_emb(h, pos.to(self.device))
        slots, pos, mask = slots.to(self.device), pos.to(self.device), mask.to(self.device)
        here = self.device
        for i, (layer, dev) in enumerate(zip(self.parts, self.devices, strict=False)):
            if dev != here:  # a layer split: the hidden state and the pass's indices move on
                h, cos, sin, slots, pos, mask = (y.to(dev) for y in (h, cos, sin, slots, pos, mask))
                here = dev
            x = layer.norm1(h)
            h = h + self._attention(i, layer, x, cos, sin, slots, pos, mask, n_keys, every_slot)
            h = h + layer.mlp(layer.norm2(h))
        out: torch.Tensor = h
        return out

    def _attention(self, i: int, layer: Parts, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   slots: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, n_keys: int,
                   every_slot: bool) -> torch.Tensor:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, t, _ = x.shape
        q = layer.q(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = layer.k(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = layer.v(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        kc, vc = self.k[i], self.v[i]
        kc[slots[:, None], :, pos] = k.transpose(1, 2)  # row b's T keys at its positions pos[b] in its slot
        vc[slots[:, None], :, pos] = v.transpose(1, 2)
        ks, vs = (kc[:, :, :n_keys], vc[:, :, :n_keys]) if every_slot else (kc[slots, :, :n_keys],
                                                                              vc[slots, :, :n_keys])
        gqa = {"enable_gqa": True} if ks.shape[1] != q.shape[1] else {}  # (torch >= 2.5; asked only when needed)
        o = F.scaled_dot_product_attention(q, ks, vs, attn_mask=mask, scale=layer.scaling, **gqa)
        out: torch.Tensor = layer.o(o.transpose(1, 2).reshape(b, t, -1))
        return out
