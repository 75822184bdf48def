"""Bytes a llama.cpp replica needs on each device: weights, KV cache and compute buffers.

The formulas follow what llama.cpp (the pinned version) allocates, and were checked against the buffer sizes it
logs when a context is created (``tests/integration/test_synth_load.py`` keeps them within 10% on the CPU):

* **KV cache**: ``layers x kv_heads x (key_len + value_len) x bytes per element x tokens``, where tokens is
  ``n_seq x n_ctx_per_seq`` and llama.cpp rounds ``n_ctx_per_seq`` up to a multiple of 256.
* **Weights**: layer ``i`` goes to the device llama.cpp's own rule gives it (``upper_bound`` of ``i / (layers+1)``
  in the cumulative split ratios); the output head counts as one more layer, so it lands on the last device; the
  token embedding always stays in host memory. Under tensor split every device holds its ratio of each matrix.
* **Compute buffer**: llama.cpp reserves the worst-case graph for ``T = min(n_ubatch, n_batch, n_ctx)`` tokens and
  its allocator reuses memory, so the buffer is the largest of three phases (4-byte activations):
  output ``4T(n_vocab + 2 n_embd)`` on the device with the head; feed-forward ``mask + 4T(3 n_ff + 4 n_embd)``;
  attention ``mask + 4T(5 n_embd + 2 kv_dim)``, plus ``4 n_kv T n_head`` for the score matrix without flash
  attention. The mask is ``n_kv x T`` at 2 bytes (flash attention) or 4.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from llamafleet.engine.devices import HOST, layer_devices
from llamafleet.model.header import ModelInfo

MIB = 1 << 20
CTX_PAD = 256
KV_ELEMENT_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def pad_ctx(n_ctx: int) -> int:
    """llama.cpp rounds each sequence's context up to a multiple of 256."""
    return -(-n_ctx // CTX_PAD) * CTX_PAD


@dataclass(frozen=True)
class ContextShape:
    """The context a replica creates: ``n_seq`` sequences of ``n_ctx_per_seq`` tokens (already padded), and
    ``n_park`` more of the same size that only hold parked KV (``cache_park``: engine/kv_park.py)."""

    n_ctx_per_seq: int
    n_seq: int
    n_batch: int
    n_ubatch: int
    kv_type: str
    flash_attn: bool
    n_park: int = 0

    @property
    def n_ctx(self) -> int:
        return self.n_ctx_per_seq * self.n_seq

    @property
    def kv_cells(self) -> int:
        """Tokens of KV the context allocates: the slots' and the parked sequences' (one more than ``n_park``, the
        spare a park and a restore of one step need: engine/kv_park.py)."""
        return self.n_ctx_per_seq * (self.n_seq + self.n_park + (1 if self.n_park else 0))

    @property
    def graph_tokens(self) -> int:
        return min(self.n_ubatch, self.n_batch, self.n_ctx)


@dataclass(frozen=True)
class DeviceNeed:
    """Bytes one device needs for one replica."""

    weights: int
    kv: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute


def kv_bytes_per_layer(model: ModelInfo, ctx: ContextShape) -> int:
    """KV cache bytes of one layer for the whole context."""
    elems = ctx.kv_cells * model.n_head_kv * (model.head_dim + model.head_dim_v)
    return int(elems * KV_ELEMENT_BYTES[ctx.kv_type])


def kv_bytes_per_token(model: ModelInfo, kv_type: str) -> float:
    """KV cache bytes one token of context costs over all layers."""
    return model.kv_elements_per_token * KV_ELEMENT_BYTES[kv_type]


def compute_bytes(model: ModelInfo, ctx: ContextShape, *, layers: bool, output: bool) -> int:
    """The compute buffer of a device that runs some layers (``layers``) and/or the output head (``output``)."""
    t = ctx.graph_tokens
    e, n_kv = model.n_embd, ctx.n_ctx_per_seq
    mask = n_kv * t * (2 if ctx.flash_attn else 4)
    phases = [0]
    if layers:
        phases.append(mask + 4 * t * (3 * model.n_ff + 4 * e))
        attn = mask + 4 * t * (5 * e + 2 * model.n_head_kv * model.head_dim)
        if not ctx.flash_attn:
            attn += 4 * n_kv * t * model.n_head
        phases.append(attn)
    if output:
        phases.append(4 * t * (model.n_vocab + 2 * e))
    return max(phases)


def output_buffer_bytes(model: ModelInfo, ctx: ContextShape) -> int:
    """Host memory for the logits of one output per sequence (llama.cpp's initial output buffer)."""
    return 4 * model.n_vocab * ctx.n_seq


def replica_needs(
    model: ModelInfo, ctx: ContextShape, mode: str, ratios: tuple[float, ...], n_gpu_layers: int = -1
) -> tuple[tuple[DeviceNeed, ...], DeviceNeed]:
    """What each GPU of a replica needs, and what stays in host memory.

    ``mode`` is ``none`` (one GPU), ``layer`` or ``tensor``; ``ratios`` has one entry per GPU. With no GPU
    (``ratios == ()``) everything is host memory. A checkpoint folder's replica is the torch engine's
    (:func:`torch_needs`).
    """
    if model.engine == "torch":
        return torch_needs(model, ctx, ratios)
    kv_layer = kv_bytes_per_layer(model, ctx)
    spread = (1.0,) if mode == "tensor" else ratios  # tensor split: one device to llama.cpp, cut inside each matrix
    where = layer_devices(model.n_layer, spread, n_gpu_layers if ratios else 0)
    n_dev = len(spread)
    weights, kv = [0] * n_dev, [0] * n_dev
    has_layers, has_output = [False] * n_dev, [False] * n_dev
    host_w, host_kv, host_layers = model.input_bytes, 0, False
    for il, dev in enumerate(where):
        is_output = il == model.n_layer
        size = model.output_bytes if is_output else model.layer_bytes[il]
        if dev == HOST:
            host_w += size - (model.input_bytes if is_output and model.tied_embeddings else 0)
            host_kv += 0 if is_output else kv_layer
            host_layers = host_layers or not is_output
            continue
        weights[dev] += size
        kv[dev] += 0 if is_output else kv_layer
        has_output[dev] = has_output[dev] or is_output
        has_layers[dev] = has_layers[dev] or not is_output
    host_out = where[-1] == HOST
    host = DeviceNeed(
        weights=host_w,
        kv=host_kv,
        compute=output_buffer_bytes(model, ctx)
        + (compute_bytes(model, ctx, layers=host_layers, output=host_out) if (host_layers or host_out) else 0),
    )
    gpus = [
        DeviceNeed(weights[d], kv[d], compute_bytes(model, ctx, layers=has_layers[d], output=has_output[d]))
        for d in range(n_dev)
    ]
    if mode == "tensor" and ratios:
        gpus = [_tensor_share(model, gpus[0], r / sum(ratios)) for r in ratios]
    return tuple(gpus), host


def _tensor_share(model: ModelInfo, whole: DeviceNeed, share: float) -> DeviceNeed:
    """One GPU's part of a tensor-split replica: its share of the weights, of the KV heads (whole heads, rounded
    up), and a full compute buffer (activations between layers are kept whole on every GPU)."""
    heads = min(model.n_head_kv, int(np.ceil(share * model.n_head_kv - 1e-9)))
    return DeviceNeed(
        weights=int(whole.weights * share),
        kv=int(whole.kv * heads / model.n_head_kv),
        compute=whole.compute,
    )


def torch_dtype(model: ModelInfo, gpu: bool) -> str:
    """The dtype of the torch engine's weights and KV cache (``engine/pytorch/forward.py``'s ``pick_dtype``): on a
    GPU f16 or bf16 as stored (f32 -> bf16), on the CPU f32 or bf16 as stored (f16 -> bf16)."""
    if gpu:
        return "f16" if model.file_type == "F16" else "bf16"
    return "f32" if model.file_type == "F32" else "bf16"


def torch_element_bytes(model: ModelInfo, gpu: bool) -> int:
    """Bytes per weight and KV element in the torch engine."""
    return 4 if torch_dtype(model, gpu) == "f32" else 2


def torch_needs(model: ModelInfo, ctx: ContextShape, ratios: tuple[float, ...]
                ) -> tuple[tuple[DeviceNeed, ...], DeviceNeed]:
    """The torch engine's replica: every layer on the device :func:`layer_devices` gives it (all on one GPU, or the
    CPU with ``ratios == ()``), the embedding with the first layer, the norm and head with the last (a tied head is
    the embedding itself); weights in the engine's dtype; a KV buffer of the whole context per layer in that dtype;
    activations as llama.cpp's compute buffer without flash attention (the attention scores of a prompt chunk), plus
    float32 logits of every slot. Host memory holds the weights only while they load."""
    gpu = bool(ratios)
    size = torch_element_bytes(model, gpu)
    scale = size / (4 if model.file_type == "F32" else 2)
    kv_layer = ctx.kv_cells * model.n_head_kv * (model.head_dim + model.head_dim_v) * size
    where = layer_devices(model.n_layer, ratios) if gpu else (0,) * (model.n_layer + 1)
    n_dev = max(1, len(ratios))
    weights, kv = [0.0] * n_dev, [0] * n_dev
    weights[where[0]] += model.input_bytes * scale
    head = model.output_bytes - (model.input_bytes if model.tied_embeddings else 0)
    weights[where[-1]] += head * scale
    for il in range(model.n_layer):
        weights[where[il]] += model.layer_bytes[il] * scale
        kv[where[il]] += kv_layer
    eager = replace(ctx, flash_attn=False)
    needs = tuple(DeviceNeed(int(weights[d]), kv[d], compute_bytes(model, eager, layers=True, output=d == where[-1])
                             + (output_buffer_bytes(model, ctx) if d == where[-1] else 0)) for d in range(n_dev))
    return (needs, DeviceNeed(0, 0, 0)) if gpu else ((), needs[0])


def with_draft(model: ModelInfo, draft: ModelInfo) -> ModelInfo:
    """``model`` with a draft model folded in (speculative decoding: the draft runs beside it in each replica, on
    the same devices, in a context of the same shape), so every estimate counts both: the draft's weights spread
    evenly over the model's layers, its KV elements per token added to each layer's values (rounded up). Its
    compute buffer, much smaller than its KV and weights for a draft worth running, is not counted."""
    extra_kv = -(-draft.kv_elements_per_token // (model.n_layer * model.n_head_kv))
    extra_w = -(-draft.weights_bytes // model.n_layer)
    return replace(model, layer_bytes=tuple(b + extra_w for b in model.layer_bytes),
                   head_dim_v=model.head_dim_v + extra_kv, weights_bytes=model.weights_bytes + draft.weights_bytes)



def with_weights(model: ModelInfo, extra: int) -> ModelInfo:
    """``model`` with ``extra`` bytes of weights loaded beside its own, spread evenly over its layers (LoRA
    adapters: llama.cpp puts each adapter tensor beside the weight it adapts)."""
    per_layer = -(-extra // model.n_layer)
    return replace(model, layer_bytes=tuple(b + per_layer for b in model.layer_bytes),
                   weights_bytes=model.weights_bytes + extra)
