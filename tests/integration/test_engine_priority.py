"""The engine's admission on the real model (SmolLM2-135M-Instruct), on CPU: a better class starts first, and a
tenant with one request gets the next free slot ahead of a tenant with many queued."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamafleet.engine.engine import Engine  # isort: skip  (llama.cpp before numpy: see engine/llama.py)

from llamafleet.engine.types import EngineConfig, Request, SamplingParams
from llamafleet.model.demo import default_model_path

SHORT = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    cfg = EngineConfig(model_path=str(default_model_path(progress=False)), n_seq=2, n_ctx_per_seq=128, n_batch=128)
    with Engine(cfg) as eng:
        yield eng


def _starts(engine: Engine) -> dict[str, int]:
    """Run until idle; the step of each request's first token (0: the first step run here)."""
    first: dict[str, int] = {}
    step = 0
    while engine.has_work():
        for out in engine.step():
            if out.token_ids:
                first.setdefault(out.request_id, step)
        step += 1
    return first


def _req(engine: Engine, rid: str, priority: int, tenant: str) -> Request:
    return Request(rid, tuple(engine.tokenize(f"Request {rid} says")), SHORT, priority, tenant)


def test_interactive_starts_before_queued_batch_work(engine: Engine) -> None:
    for i in range(6):
        engine.add_request(_req(engine, f"b{i}", 2, "bulk"))
    engine.step()  # two batch requests take the two slots
    engine.add_request(_req(engine, "chat", 0, "agents"))
    first = _starts(engine)
    # at the first slot that frees, ahead of the four batch requests still waiting
    assert first["chat"] <= min(first[f"b{i}"] for i in range(2, 6)), first


def test_a_lone_request_gets_the_next_slot_ahead_of_a_tenant_with_many_queued(engine: Engine) -> None:
    for i in range(8):
        engine.add_request(_req(engine, f"a{i}", 1, "many"))
    engine.step()
    engine.add_request(_req(engine, "lone", 1, "one"))
    first = _starts(engine)
    turnover = min(first[f"a{i}"] for i in range(2, 8))  # the first slot that freed went to a waiting request
    # the lone request took one of the slots that freed: it starts no later than the many's next (two prompts admitted
    # together may be prefilled one after the other, engine/scheduler.py, so it can start a step before it)
    assert first["lone"] <= turnover, first
