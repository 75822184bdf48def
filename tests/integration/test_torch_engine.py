"""The torch engine in-process on the tiny random checkpoint: its pass agrees with transformers' own forward, batching
changes no answer, sampling means what it means for llama.cpp, what it does not implement is refused, and the
planner's memory estimate matches what it allocates."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

from hf_models import tiny_checkpoint  # noqa: F401  (the session fixture)
from llamafleet.config import FleetConfig
from llamafleet.engine.infill import Infill
from llamafleet.engine.pytorch.engine import TorchEngine
from llamafleet.engine.pytorch.forward import Group
from llamafleet.engine.textside import TextSide
from llamafleet.engine.types import EmbeddingRequest, EngineConfig, Request, SamplingParams
from llamafleet.model.checkpoint import describe
from llamafleet.model.convert_hf import checkpoint_to_gguf
from llamafleet.model.synth import find_vocab
from llamafleet.placement.gpus import Inventory
from llamafleet.placement.memory import replica_needs
from llamafleet.placement.planner import context_shape, launch_spec, make_plan

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time", "中国的首都是", "def f(x):"]


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> Iterator[TorchEngine]:  # noqa: F811
    cfg = EngineConfig(model_path=str(tiny_checkpoint), engine="torch", n_seq=4, n_ctx_per_seq=256, n_batch=256,
                       prefill_tokens=8, n_threads=1)
    with TorchEngine(cfg) as eng:
        yield eng


def req(eng: TextSide[Any], rid: str, prompt: str, params: SamplingParams = GREEDY) -> Request:
    return Request(rid, tuple(eng.tokenize(prompt)), params)


def test_the_slot_pass_gives_transformers_own_logits(engine: TorchEngine, tiny_checkpoint: Path) -> None:  # noqa: F811
    """Prefill in two chunks into slot 2, then one decode step batched with another slot at another position: each
    row's logits are what LlamaForCausalLM computes for that sequence whole."""
    ref = LlamaForCausalLM.from_pretrained(str(tiny_checkpoint), dtype=torch.float32)
    a = engine.tokenize("The quick brown fox jumps over")
    b = engine.tokenize("1, 2, 3")
    net = engine.net
    cpu = torch.device("cpu")
    net.forward(Group.of([a[:3]], [2], [0], cpu))
    net.forward(Group.of([a[3:-1]], [2], [3], cpu))
    net.forward(Group.of([b[:-1]], [0], [0], cpu))
    both = net.forward(Group.of([[a[-1]], [b[-1]]], [2, 0], [len(a) - 1, len(b) - 1], cpu))
    with torch.inference_mode():
        want_a = ref(torch.tensor([a])).logits[0, -1]
        want_b = ref(torch.tensor([b])).logits[0, -1]
    torch.testing.assert_close(both[0], want_a, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(both[1], want_b, atol=1e-4, rtol=1e-4)


def test_greedy_answers_are_the_same_alone_and_batched(engine: TorchEngine) -> None:
    alone = {p: engine.generate([req(engine, "x", p)])["x"].token_ids for p in PROMPTS}
    together = engine.generate([req(engine, str(i), p) for i, p in enumerate(PROMPTS)])  # 5 requests, 4 slots
    assert {p: together[str(i)].token_ids for i, p in enumerate(PROMPTS)} == alone
    assert all(len(t) == 12 for t in alone.values())


def test_seeded_sampling_is_reproducible_and_seed_matters(engine: TorchEngine) -> None:
    def draw(seed: int) -> list[int]:
        p = SamplingParams(max_tokens=8, temperature=1.0, top_k=0, min_p=0.0, seed=seed, ignore_eos=True)
        return engine.generate([req(engine, "s", "Hello", p)])["s"].token_ids

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)
    top1 = SamplingParams(max_tokens=8, temperature=1.0, top_k=1, seed=3, ignore_eos=True)
    assert engine.generate([req(engine, "k", "Hello", top1)])["k"].token_ids == \
        engine.generate([req(engine, "g", "Hello", GREEDY)])["g"].token_ids[:8]


def test_logit_bias_penalties_and_logprobs(engine: TorchEngine) -> None:
    forced = SamplingParams(max_tokens=4, temperature=0.0, logit_bias=((1000, 100.0),), logprobs=True,
                            top_logprobs=3, ignore_eos=True)
    g = engine.generate([req(engine, "b", "Hello", forced)])["b"]
    assert g.token_ids == [1000] * 4
    assert len(g.logprobs) == 4 and all(lp <= 0 for lp in g.logprobs)
    assert all(len(top) == 3 and top[0][1] >= top[1][1] for top in g.top_logprobs)
    # a repeat penalty as strong as it gets never picks the same token twice when it has other choices
    no_repeat = SamplingParams(max_tokens=6, temperature=0.0, repeat_penalty=1e6, penalty_last_n=-1,
                               presence_penalty=2.0, ignore_eos=True)
    toks = engine.generate([req(engine, "p", "Hello", no_repeat)])["p"].token_ids
    assert len(set(toks)) == len(toks)


def test_stop_strings_and_max_tokens(engine: TorchEngine) -> None:
    whole = engine.generate([req(engine, "w", "1, 2, 3,")])["w"]
    stop = whole.text[4:7]
    assert stop.strip()
    cut = engine.generate([req(engine, "c", "1, 2, 3,", SamplingParams(max_tokens=12, temperature=0.0,
                                                                        stop=(stop,), ignore_eos=True))])["c"]
    assert cut.finish_reason == "stop" and cut.text == whole.text[:whole.text.index(stop)]
    assert whole.finish_reason == "length" and whole.completion_tokens == 12


def test_abort_frees_the_slot(engine: TorchEngine) -> None:
    engine.add_request(req(engine, "a", "Hello", SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)))
    engine.step()
    engine.abort("a")
    outs = []
    while engine.has_work():
        outs += engine.step()
    assert outs[-1].finish_reason == "cancelled" and engine.stats().slots_busy == 0


@pytest.mark.parametrize("params", [SamplingParams(grammar='root ::= "a"'), SamplingParams(prompt_logprobs=True),
                                   SamplingParams(think_budget=8)])
def test_what_it_does_not_implement_is_refused_naming_llama_cpp(engine: TorchEngine, params: SamplingParams) -> None:
    with pytest.raises(ValueError, match="llama.cpp engine"):
        engine.add_request(req(engine, "r", "Hello", params))
    with pytest.raises(ValueError, match="llama.cpp engine"):
        engine.add_embedding(EmbeddingRequest("e", ((1, 2),)))
    with pytest.raises(ValueError, match="fill-in-the-middle.*llama.cpp engine"):
        engine.tokenize_infill(Infill(prefix="a", suffix="b"), 8)


def test_the_planner_estimate_is_within_10_percent_of_what_it_allocates(tiny_checkpoint: Path) -> None:  # noqa: F811
    """Weights and KV cache as the CPU plan budgets them, against the bytes of the engine's tensors."""
    cfg = FleetConfig(model_path=str(tiny_checkpoint), parallel=4, context_length=512, threads=1)
    plan = make_plan(describe(tiny_checkpoint), Inventory(gpus=(), links=(), source="none", host_mem_mib=64 << 10), cfg)
    assert plan.fits, plan.reasons
    _, ecfg = launch_spec(plan, 0, cfg, str(tiny_checkpoint))
    assert ecfg.engine == "torch"
    _, host = replica_needs(describe(tiny_checkpoint), context_shape(describe(tiny_checkpoint), cfg), "none", ())
    with TorchEngine(ecfg) as eng:
        weights, kv = eng.allocated_bytes()
    assert abs(host.weights - weights) <= 0.1 * weights
    assert abs(host.kv - kv) <= 0.1 * kv
    assert plan.budgets[0].weights_mib == -(-host.weights // (1 << 20))  # what the plan shows, rounded up


def test_the_same_weights_as_an_f16_gguf_give_llama_cpp_the_same_greedy_answers(
        engine: TorchEngine, tiny_checkpoint: Path, tmp_path: Path) -> None:  # noqa: F811
    """The checkpoint converted with the gguf package's writer (llama.cpp's names, its rotary layout, F16 matrices)
    and served by the llama.cpp engine: the same chat tokens, the same greedy answers, logprobs within 1e-3."""
    from llamafleet.engine.engine import Engine  # llama.cpp, loaded only here

    gguf = checkpoint_to_gguf(tiny_checkpoint, tmp_path / "tiny.f16.gguf", find_vocab())
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=True)
    chat = [{"role": "user", "content": "Name three colours."}]
    with Engine(EngineConfig(model_path=str(gguf), n_seq=4, n_ctx_per_seq=256, n_threads=1)) as cpp:
        assert cpp.tokenize_chat(chat) == engine.tokenize_chat(chat)
        theirs = cpp.generate([req(cpp, str(i), p, params) for i, p in enumerate(PROMPTS)])
    ours = engine.generate([req(engine, str(i), p, params) for i, p in enumerate(PROMPTS)])
    for i in map(str, range(len(PROMPTS))):
        assert ours[i].token_ids == theirs[i].token_ids
        assert max(abs(a - b) for a, b in zip(ours[i].logprobs, theirs[i].logprobs, strict=True)) < 1e-3
