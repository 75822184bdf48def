"""Byte counts the planner budgets: llama.cpp's layer placement rule, KV cache sizes, splits of a replica."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafleet.engine.devices import HOST, layer_devices
from llamafleet.model.header import ModelInfo, read_model_info
from llamafleet.placement.memory import (
    ContextShape,
    compute_bytes,
    kv_bytes_per_layer,
    pad_ctx,
    replica_needs,
)
from synth_models import sparse_models

GIB = 2**30


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelInfo]:
    return sparse_models(tmp_path_factory)


def ctx(n_ctx: int = 4096, n_seq: int = 8, kv: str = "f16", fa: bool = True, ubatch: int = 512) -> ContextShape:
    return ContextShape(n_ctx_per_seq=n_ctx, n_seq=n_seq, n_batch=512, n_ubatch=ubatch, kv_type=kv, flash_attn=fa)


def test_layer_placement_follows_llama_cpp() -> None:
    # Layer il goes to the first device whose cumulative share exceeds il / (n_layer + 1); the head is "layer n".
    even = layer_devices(32, (0.5, 0.5))
    assert even.count(0) == 17 and even[:17] == (0,) * 17 and even[17:] == (1,) * 16
    uneven = layer_devices(80, (3.0, 1.0))  # 0.75: il / 81 < 0.75 for il <= 60
    assert uneven.count(0) == 61 and uneven[-1] == 1
    partial = layer_devices(32, (1.0,), n_gpu_layers=10)  # the last 9 layers and the head are offloaded
    assert partial == (HOST,) * 23 + (0,) * 10
    assert layer_devices(32, ()) == (HOST,) * 33


def test_context_is_padded_like_llama_cpp() -> None:
    assert [pad_ctx(n) for n in (1, 256, 257, 4000, 4096)] == [256, 256, 512, 4096, 4096]


def test_kv_cache_sizes(models: dict[str, ModelInfo]) -> None:
    # 7B: 32 layers x 32 KV heads x 128 x (K+V) x 2 bytes = 512 KiB per token; 8 x 4096 tokens = 16 GiB.
    assert kv_bytes_per_layer(models["7b-q4_0"], ctx()) * 32 == 16 * GIB
    assert kv_bytes_per_layer(models["7b-q4_0"], ctx(kv="q8_0")) * 32 == 16 * GIB * 34 // 64
    # 70B has 8 KV heads (grouped-query attention): 320 KiB per token.
    assert kv_bytes_per_layer(models["70b-q4_0"], ctx()) * 80 == 10 * GIB


def test_compute_buffer_phases(models: dict[str, ModelInfo]) -> None:
    m = models["70b-q4_0"]
    full = compute_bytes(m, ctx(), layers=True, output=True)
    assert compute_bytes(m, ctx(ubatch=256), layers=True, output=True) == pytest.approx(full / 2, rel=0.02)
    assert compute_bytes(m, ctx(fa=False, n_ctx=32768), layers=True, output=False) > 4 * full  # score matrix
    small = models["7b-q4_0"]
    assert compute_bytes(small, ctx(), layers=False, output=True) == 4 * 512 * (32000 + 2 * 4096)
    assert compute_bytes(small, ctx(), layers=False, output=False) == 0


def test_layer_split_accounts_every_byte(models: dict[str, ModelInfo]) -> None:
    m = models["13b-q8_0"]
    gpus, host = replica_needs(m, ctx(), "layer", (0.5, 0.5))
    assert sum(g.weights for g in gpus) + host.weights == m.weights_bytes
    assert host.weights == m.input_bytes and host.kv == 0
    assert sum(g.kv for g in gpus) == kv_bytes_per_layer(m, ctx()) * 40


def test_tensor_split_shares_matrices_and_whole_kv_heads(models: dict[str, ModelInfo]) -> None:
    m = models["70b-f16"]
    (whole,), _ = replica_needs(m, ctx(), "none", (1.0,))
    even, _ = replica_needs(m, ctx(), "tensor", (0.5, 0.5))
    assert [g.weights for g in even] == [whole.weights // 2] * 2
    assert [g.kv for g in even] == [whole.kv // 2] * 2
    uneven, _ = replica_needs(m, ctx(), "tensor", (0.7, 0.3))
    assert uneven[1].kv == whole.kv * 3 // 8  # 0.3 of 8 heads rounds up to 3
    assert all(g.compute == whole.compute for g in uneven)


def test_cpu_replica_is_all_host(models: dict[str, ModelInfo]) -> None:
    m = models["7b-q4_0"]
    gpus, host = replica_needs(m, ctx(), "none", ())
    assert gpus == ()
    assert host.weights == m.weights_bytes and host.kv == 16 * GIB
    assert host.compute == compute_bytes(m, ctx(), layers=True, output=True) + 4 * 32000 * 8


def test_model_fixture_files_are_sparse(models: dict[str, ModelInfo]) -> None:
    assert all(Path(m.path).stat().st_blocks * 512 < 16 * 2**20 for m in models.values())


def test_tied_head_is_a_copy_on_a_gpu_but_not_in_host_memory(model_path: Path) -> None:
    m = read_model_info(model_path)  # SmolLM2: the head is the token embedding
    assert m.tied_embeddings
    _, host = replica_needs(m, ctx(), "none", ())
    assert host.weights == m.weights_bytes
    (gpu,), host = replica_needs(m, ctx(), "none", (1.0,))
    assert gpu.weights == m.weights_bytes  # layers + norm + a copy of the embedding as the head
    assert host.weights == m.input_bytes  # the embedding itself stays in host memory for the input
