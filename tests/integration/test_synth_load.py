"""Synthetic models run in llama.cpp, and the planner's memory prediction matches what llama.cpp allocates (CPU).

Each prediction is checked in a fresh worker-like process started with the environment and engine configuration
that :func:`llamafleet.placement.planner.launch_spec` gives; llama.cpp's own log lines (routed into Python logging by
the engine) report the buffers it allocated.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest

from llamafleet.config import FleetConfig
from llamafleet.model.header import read_model_info
from llamafleet.model.synth import SHAPES, find_vocab, write_model
from llamafleet.placement.gpus import Inventory
from llamafleet.placement.planner import launch_spec, make_plan

TOLERANCE = 0.10
LOAD = """
import json, logging, sys
from llamafleet.engine.llama import Context, Model
from llamafleet.engine.types import EngineConfig
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
cfg = json.loads(sys.argv[1])
cfg = EngineConfig(**{**cfg, "tensor_split": tuple(cfg["tensor_split"])})
with Model(cfg) as model, Context(model, cfg):
    pass
"""
BUFFER = re.compile(r"(\S+)\s+(KV|compute|output|model) buffer size\s*=\s*([\d.]+) MiB")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tiny")
    return {q: write_model(folder / f"tiny-{q}.gguf", SHAPES["tiny"], q, find_vocab(), progress=False)
            for q in ("q4_0", "f16")}


def test_tiny_model_decodes_with_finite_logits(tiny: dict[str, Path]) -> None:
    llm = llama_cpp.Llama(str(tiny["q4_0"]), n_ctx=256, n_gpu_layers=0, logits_all=True, verbose=False)
    try:
        tokens = llm.tokenize(b"Hello world, this is a test")
        assert tokens[:3] == [1, 15043, 3186]  # the LLaMA-2 tokenizer: <s> Hello world
        llm.eval(tokens)
        for _ in range(4):  # a few greedy decode steps after the prompt
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([nxt])
        logits = np.asarray(llm.scores[: llm.n_tokens])
        assert logits.shape == (len(tokens) + 4, 32000)
        assert np.isfinite(logits).all()
        assert 0.05 < float(logits.std()) < 50.0  # neither dead nor exploding activations
    finally:
        llm.close()


def test_llama3_shape_answers_with_its_tokenizer_and_planned_memory(tmp_path: Path) -> None:
    # Llama-3-8B's shape but for its size: 4:1 grouped-query attention, rope base 500,000, the llama-bpe vocabulary
    shape = dataclasses.replace(SHAPES["llama3-8b"], n_layer=2, n_embd=256, n_head=4, n_head_kv=1, n_ff=896)
    path = write_model(tmp_path / "l3.gguf", shape, "q4_0", find_vocab(shape.vocab), progress=False)
    llm = llama_cpp.Llama(str(path), n_ctx=256, n_gpu_layers=0, logits_all=True, verbose=False)
    try:
        assert float(llm.metadata["llama.rope.freq_base"]) == 500000.0
        tokens = llm.tokenize(b"Hello world")
        assert tokens == [128000, 9906, 1917]  # <|begin_of_text|> Hello world
        answer = llm.create_completion("Hello world", max_tokens=4, temperature=0.0)
        assert answer["usage"]["completion_tokens"] >= 1
        logits = np.asarray(llm.scores[: llm.n_tokens])
        assert logits.shape[1] == 128256 and np.isfinite(logits).all()
    finally:
        llm.close()
    sizes, budget = allocated(path, parallel=4, context_length=1024)
    check(sizes, budget, weights=False)


def allocated(model: Path, **cfg: Any) -> tuple[dict[str, float], Any]:
    """Plan ``model`` for this CPU under ``cfg``, start it as a worker would, and return what llama.cpp logged."""
    fleet = FleetConfig(llama_log_level="info", **cfg)
    plan = make_plan(read_model_info(model), Inventory((), (), "none", note="test: CPU"), fleet)
    assert plan.fits and plan.device == "cpu", plan.reasons
    env, engine = launch_spec(plan, 0, fleet, str(model))
    done = subprocess.run([sys.executable, "-c", LOAD, json.dumps(dataclasses.asdict(engine))],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sizes: dict[str, float] = {}
    for m in BUFFER.finditer(done.stdout):
        key = f"{m.group(1)} {m.group(2)}"
        sizes[key] = sizes.get(key, 0.0) + float(m.group(3))
    assert "CPU KV" in sizes and "CPU compute" in sizes, done.stdout[-3000:]
    return sizes, plan.budgets[0]


CASES = [
    ("q4_0", {"parallel": 4, "context_length": 1024}),
    ("q4_0", {"parallel": 1, "context_length": 2048, "kv_cache_type": "q8_0"}),
    ("f16", {"parallel": 2, "context_length": 2048, "ubatch_size": 128, "flash_attn": False}),
    ("f16", {"parallel": 8, "context_length": 512, "batch_size": 256, "flash_attn": True}),
]


@pytest.mark.parametrize(("quant", "cfg"), CASES)
def test_prediction_matches_llama_cpp_on_tiny(tiny: dict[str, Path], quant: str, cfg: dict[str, Any]) -> None:
    sizes, budget = allocated(tiny[quant], **cfg)
    check(sizes, budget, weights=quant == "f16")


@pytest.mark.parametrize(
    "cfg",
    [
        {"parallel": 4, "context_length": 2048},
        {"parallel": 2, "context_length": 4096, "flash_attn": False},
        {"parallel": 1, "context_length": 8192, "ubatch_size": 256},
    ],
)
def test_prediction_matches_llama_cpp_on_the_real_model(model_path: Path, cfg: dict[str, Any]) -> None:
    sizes, budget = allocated(model_path, **cfg)
    check(sizes, budget, weights=True)  # Q4_1 is not repacked on the CPU: the mapped buffer is the file's weights


def check(sizes: dict[str, float], budget: Any, *, weights: bool) -> None:
    measured_compute = sizes["CPU compute"] + sizes.get("CPU output", 0.0)
    pairs = [("KV cache", budget.kv_mib, sizes["CPU KV"]), ("compute + output", budget.compute_mib, measured_compute)]
    if weights:
        pairs.append(("weights", budget.weights_mib, sizes["CPU_Mapped model"]))
    for what, predicted, measured in pairs:
        assert abs(predicted - measured) <= TOLERANCE * measured + 1.0, (
            f"{what}: predicted {predicted} MiB, llama.cpp allocated {measured:.2f} MiB ({sizes})")
