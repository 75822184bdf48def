"""The torch engine's test model: a tiny LLaMA checkpoint folder with random weights (2 layers, hidden 64,
grouped-query attention) and LLaMA-2's real tokenizer and chat template, written once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafleet.model.synth import CHAT_TEMPLATE, Shape, find_vocab
from llamafleet.model.synth_hf import write_checkpoint

TINY = Shape("tiny-hf", n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=2048)

_written: dict[str, Path] = {}


def tiny_checkpoint_path(factory: pytest.TempPathFactory) -> Path:
    """The folder of the tiny checkpoint (fp32 weights), written on first use."""
    if "tiny" not in _written:
        _written["tiny"] = write_checkpoint(factory.mktemp("hf") / "tiny-hf", TINY, "f32", find_vocab(),
                                            CHAT_TEMPLATE, seed=1)
    return _written["tiny"]


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint_path(tmp_path_factory)
