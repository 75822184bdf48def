"""The KV tiers' copies on the real model, on CPU, by the counters (engine/kv_cost.py): a burst of saves is spread
over steps while a running answer keeps decoding between them, and a copy measured to be slower than prefilling is
not made (the prompt is prefilled instead, to the same answer)."""

from __future__ import annotations

from pathlib import Path

from llamafleet.engine.engine import Engine  # isort: skip  (llama.cpp before numpy: see engine/llama.py)

from llamafleet.bench.prompts import synthetic_text
from llamafleet.engine.types import EngineConfig, Request, SamplingParams

MIB = 1 << 20
SHORT = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def prompt(eng: Engine, name: str, words: int = 120) -> tuple[int, ...]:
    return tuple(eng.tokenize(synthetic_text(words, name)))


def test_a_burst_of_saves_is_spread_over_steps_while_a_running_answer_keeps_decoding(model_path: Path) -> None:
    cfg = EngineConfig(model_path=str(model_path), n_seq=3, n_ctx_per_seq=512, n_batch=256, n_threads=1,
                       cache_ram_bytes=256 * MIB, copy_budget_s=0.0)  # one copy per step
    with Engine(cfg) as eng:
        eng.generate([Request(f"warm{i}", prompt(eng, f"warm/{i}"), SHORT) for i in range(3)])  # 3 warm slots
        eng.add_request(Request("r", prompt(eng, "running"), SamplingParams(max_tokens=40, temperature=0.0,
                                                                            ignore_eos=True)))
        decoded = 0
        while decoded == 0:  # r took slot 0 (its state saved first) and is decoding
            decoded += sum(len(o.token_ids) for o in eng.step() if o.request_id == "r")
        assert eng.stats().tiers.saves == 1  # type: ignore[union-attr]
        for i in range(2):  # two new prompts at once, each taking a warm slot whose state is saved first
            eng.add_request(Request(f"new{i}", prompt(eng, f"new/{i}"), SHORT))
        saves_at: list[int] = []  # r's tokens when each further save was made
        while eng.has_work():
            before = eng.stats().tiers.saves  # type: ignore[union-attr]
            decoded += sum(len(o.token_ids) for o in eng.step() if o.request_id == "r")
            t = eng.stats().tiers
            assert t is not None and t.saves - before <= 1  # never two copies in one step
            saves_at += [decoded] * (t.saves - before)
        assert t.saves == 3 and t.deferrals >= 1
        assert saves_at[1] > saves_at[0]  # r decoded between the two saves


def test_copies_measured_slower_than_prefilling_are_not_made(model_path: Path) -> None:
    cfg = EngineConfig(model_path=str(model_path), n_seq=1, n_ctx_per_seq=512, n_batch=256, n_threads=1,
                       cache_ram_bytes=256 * MIB)
    with Engine(cfg) as eng:
        a, b = prompt(eng, "a"), prompt(eng, "b")
        first = eng.generate([Request("a1", a, SHORT)])["a1"]
        eng.tiers.costs.save.add(1000.0, 1000)  # as if a save had taken a second per token: never worth it
        eng.generate([Request("b1", b, SHORT)])  # takes a's slot: a is not saved
        t = eng.stats().tiers
        assert t is not None and t.saves == 0 and t.declined["save"] == 1
        eng.tiers.costs.save.per_token = None  # unmeasured again: b is saved when a comes back
        again = eng.generate([Request("a2", a, SHORT)])["a2"]
        assert again.cached_tokens < 32 and again.token_ids == first.token_ids  # a miss, prefilled
        t = eng.stats().tiers
        assert t is not None and t.saves == 1
        eng.tiers.costs.restore["ram"].add(1000.0, 1000)  # restoring b: slower than prefilling it
        eng.generate([Request("b2", b, SHORT)])
        t = eng.stats().tiers
        assert t is not None and t.declined["restore"] == 1 and t.hits["ram"] == 0


def test_a_sessions_next_state_replaces_the_one_it_went_on_from_in_that_states_buffer(model_path: Path) -> None:
    """A later turn re-sends its last answer re-tokenized, so its state never extends the one it was restored from
    token for token: that older state goes, and its buffer takes the new one (no new memory: engine/kv_buffers.py);
    the RAM tier holds one state per session."""
    cfg = EngineConfig(model_path=str(model_path), n_seq=1, n_ctx_per_seq=512, n_batch=256, n_threads=1,
                       cache_ram_bytes=256 * MIB)
    with Engine(cfg) as eng:
        a, b = prompt(eng, "a"), prompt(eng, "b")
        answer = eng.generate([Request("a1", a, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))])
        eng.generate([Request("b1", b, SHORT)])  # takes a's slot: a's state is saved
        # a's next turn: its answer but the last two tokens as they came back, then a new line
        turn2 = a + tuple(answer["a1"].token_ids[:-2]) + prompt(eng, "a/next", 20)
        again = eng.generate([Request("a2", turn2, SHORT)])["a2"]
        assert again.cached_tokens >= len(a)  # restored from RAM
        eng.generate([Request("b2", b, SHORT)])  # takes it back: a's turn-2 state is saved, its turn-1 one goes
        t = eng.stats().tiers
        assert t is not None and t.saves == 3 and t.ram_entries == 2
        assert eng.tiers.buffers.reused == 1
        assert t.ram_bytes <= cfg.cache_ram_bytes
