"""Native memory is freed deterministically, and llama.cpp's log lines reach Python logging."""

from __future__ import annotations

import logging
import os

import pytest

from llamafleet.engine.llama import Context, Model
from llamafleet.engine.types import EngineConfig
from llamafleet.model.demo import default_model_path


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cfg(**kw: object) -> EngineConfig:
    base = dict(model_path=str(default_model_path(progress=False)), n_seq=8, n_ctx_per_seq=512, n_batch=256,
                n_threads=2)
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


def test_context_memory_returns_after_50_create_free_cycles() -> None:
    with Model(cfg()) as model:
        with Context(model, cfg()):
            pass
        baseline = rss_mib()
        with Context(model, cfg()) as ctx:
            held = rss_mib()
            assert ctx.n_ctx == 8 * 512
        one_context = held - baseline
        for _ in range(50):
            with Context(model, cfg()):
                pass
        after = rss_mib()
    # a leak of even a fraction of one context per cycle would show as many MiB over 50 cycles
    assert after - baseline < max(8.0, 0.5 * one_context), (baseline, held, after)


def test_model_load_free_cycles_do_not_grow() -> None:
    with Model(cfg()):
        pass
    baseline = rss_mib()
    for _ in range(5):
        with Model(cfg()):
            pass
    assert rss_mib() - baseline < 20.0


def test_llama_cpp_logs_are_routed_to_python_logging(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="llamafleet.llama_cpp"):
        with Model(cfg(llama_log_level="info")) as model, Context(model, cfg()):
            pass
        info = [r for r in caplog.records if r.name == "llamafleet.llama_cpp"]
        assert len(info) > 20  # model loading is chatty
        assert any("n_ctx" in r.getMessage() for r in info)
        caplog.clear()
        with Model(cfg(llama_log_level="error")) as model, Context(model, cfg()):
            pass
        assert not [r for r in caplog.records if r.name == "llamafleet.llama_cpp" and r.levelno < logging.ERROR]


def test_missing_model_file_gives_a_clear_error(tmp_path: pytest.TempPathFactory) -> None:
    with pytest.raises(RuntimeError, match="could not load the model"):
        Model(cfg(model_path=str(tmp_path) + "/nope.gguf"))
