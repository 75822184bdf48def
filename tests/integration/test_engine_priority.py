"""The engine's admission on the real model (SmolLM2-135M-Instruct), on CPU: a better class starts first, a tenant
with one request gets the next free slot ahead of a tenant with many queued, and batch answers give way in the
pass of a better prompt."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamafleet.engine.engine import Engine  # isort: skip  (llama.cpp before numpy: see engine/llama.py)

from llamafleet.engine.types import EngineConfig, PriorityConfig, Request, SamplingParams
from llamafleet.model.demo import default_model_path

SHORT = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    cfg = EngineConfig(model_path=str(default_model_path(progress=False)), n_seq=2, n_ctx_per_seq=128, n_batch=128)
    with Engine(cfg) as eng:
        yield eng


@pytest.fixture(scope="module")
def wide() -> Iterator[Engine]:
    """Four slots; beside a better prompt batch work takes no share of the pass (only the floor of one token, while the
    prompt goes on after it), however passes cost."""
    cfg = EngineConfig(model_path=str(default_model_path(progress=False)), n_seq=4, n_ctx_per_seq=256, n_batch=256,
                       priorities=PriorityConfig(batch_share=0.0))
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


def test_batch_answers_give_way_in_the_pass_of_a_better_prompt(wide: Engine) -> None:
    long = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    for i in range(3):  # prompts of ~60 tokens, then one-token passes: the engine learns what a pass costs
        wide.add_request(Request(f"b{i}", tuple(wide.tokenize(f"Batch item {i}: " + "count the fruits, " * 12)), long,
                                 2, "bulk"))
    started: set[str] = set()
    while len(started) < 3:
        started |= {o.request_id for o in wide.step() if o.token_ids}
    for _ in range(3):
        wide.step()
    wide.add_request(Request("chat", tuple(wide.tokenize("A question from a person: why?")), SHORT, 0, "chat"))
    beside = []  # per step holding a token of the chat's answer: the batch tokens of the same pass
    while wide.has_work():
        outs = wide.step()
        if any(o.request_id == "chat" and o.token_ids for o in outs):
            beside.append(sum(len(o.token_ids) for o in outs if o.request_id != "chat"))
    # its prompt's pass (its only one) took no batch token (without the rule: all three answers'); its answer's all
    assert beside == [0] + [3] * (SHORT.max_tokens - 1), beside
