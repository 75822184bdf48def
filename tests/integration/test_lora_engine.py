"""LoRA adapters through the engine (engine/lora.py), on a synthetic tiny model and two adapters ``synth`` writes for
it: requests with different adapters decode in one step, each as it would alone; a scale of 0 is the base model;
a step of two sets switches the context's adapters once; an adapter unloaded while a request uses it serves that
request to its end; an unknown adapter is refused by name; adapter KV is never reused by the base model."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from llamafleet.cli import main
from llamafleet.engine.engine import Engine
from llamafleet.engine.types import EngineConfig, LoraSpec, Request, SamplingParams
from llamafleet.model.synth import SHAPES, find_vocab, write_model

PROMPT = tuple([1, *range(450, 490)])  # 41 tokens: more than the prefix cache's least reuse
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    folder = tmp_path_factory.mktemp("lora-engine")
    base = write_model(folder / "tiny.gguf", SHAPES["tiny"], "q8_0", find_vocab(), progress=False)
    specs = []
    for name, seed in (("a", 1), ("b", 2)):
        path = folder / f"lora-{name}.gguf"
        assert main(["synth", "--lora-for", str(base), "--seed", str(seed), "-o", str(path)]) == 0
        specs.append(LoraSpec(name, str(path)))
    cfg = EngineConfig(str(base), n_seq=4, n_ctx_per_seq=128, n_batch=128, n_threads=1, overlap=False,
                       lora=tuple(specs))
    with Engine(cfg) as eng:
        yield eng


def run(engine: Engine, *lora: tuple[tuple[str, float], ...]) -> tuple[list[list[int]], int]:
    """Requests with these adapter sets, run together; each one's tokens and the steps in which all produced one."""
    reqs = [Request(f"r{i}-{id(lora)}", PROMPT, replace(GREEDY, lora=set_)) for i, set_ in enumerate(lora)]
    tokens: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    for r in reqs:
        engine.add_request(r)
    together = 0
    while engine.has_work():
        outs = engine.step()
        for o in outs:
            tokens[o.request_id] += o.token_ids
        together += len(reqs) > 1 and {o.request_id for o in outs if o.token_ids} == set(tokens)
    return [tokens[r.request_id] for r in reqs], together


def test_scale_zero_is_the_base_model_and_adapters_change_the_answer(engine: Engine) -> None:
    base = run(engine, ())[0][0]
    assert run(engine, (("a", 0.0),))[0][0] == base
    a, b = run(engine, (("a", 1.0),))[0][0], run(engine, (("b", 1.0),))[0][0]
    assert a != base and b != base and a != b


def test_different_adapters_in_one_step_each_as_alone(engine: Engine) -> None:
    alone = [run(engine, s)[0][0] for s in ((("a", 1.0),), (("b", 1.0),), ())]
    switches, steps = engine.lora.switches, engine.stats().steps
    together, shared = run(engine, (("a", 1.0),), (("b", 1.0),), ())
    assert together == alone
    assert shared >= len(alone[0]) - len(alone)  # they advanced in the same steps (prompts may start apart)
    # a step of three sets switches twice, not three times: the set left on the context decodes first next step
    assert engine.lora.switches - switches <= 2 * (engine.stats().steps - steps)


def test_unknown_adapter_is_refused_by_name(engine: Engine) -> None:
    with pytest.raises(ValueError, match="no LoRA adapter 'c'"):
        engine.add_request(Request("bad", PROMPT, replace(GREEDY, lora=(("c", 1.0),))))


def test_an_adapter_unloaded_while_used_serves_its_requests(engine: Engine) -> None:
    specs = engine.cfg.lora
    alone = run(engine, (("b", 1.0),))[0][0]
    engine.add_request(Request("during", PROMPT, replace(GREEDY, lora=(("b", 1.0),))))
    engine.step()
    engine.lora.sync([s for s in specs if s.name != "b"])
    got: list[int] = []
    while engine.has_work():
        got += [t for o in engine.step() for t in o.token_ids]
    assert engine.step() == [] and got == alone[len(alone) - len(got):]
    with pytest.raises(ValueError, match="no LoRA adapter 'b'"):
        engine.add_request(Request("after", PROMPT, replace(GREEDY, lora=(("b", 1.0),))))
    engine.lora.sync(specs)
    assert run(engine, (("b", 1.0),))[0][0] == alone


def test_adapter_kv_is_not_reused_by_the_base_model(engine: Engine) -> None:
    base = run(engine, ())[0][0]
    run(engine, (("a", 1.0),))  # its KV for the same prompt stays in no slot the base model could reuse
    cached = engine.stats().prompt_tokens_cached_total
    assert run(engine, ())[0][0] == base
    assert engine.stats().prompt_tokens_cached_total > cached  # the base model's own KV is still reused
