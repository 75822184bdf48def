"""Speculative decoding's pure parts: prompt lookup, the per-sequence policy, the step-wide rule, the settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafleet.config import load_config
from llamafleet.engine.budget import ThinkBudget
from llamafleet.engine.scheduler import schedule
from llamafleet.engine.sequence import Sequence
from llamafleet.engine.speculative.policy import PROBE, PassCost, Track
from llamafleet.engine.speculative.settings import MAX_DRAFT_LIMIT, SpeculativeConfig
from llamafleet.engine.speculative.source import Ask, NgramIndex, NgramSource
from llamafleet.engine.speculative.speculator import Speculator
from llamafleet.engine.types import Request, SamplingParams


def test_lookup_drafts_what_followed_the_latest_earlier_occurrence_of_the_longest_tail() -> None:
    idx = NgramIndex(2, 3)
    text = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    # tail (1, 2, 3) occurred at 0..2, followed by 4 5 9; (2, 3) last occurred at 6..7, followed by 7 8 — the
    # longer match wins
    assert idx.draft(text, 3) == [4, 5, 9]
    assert idx.draft([*text, 4, 6, 6], 4) == []  # tail (4, 6, 6) nor (6, 6) seen before
    assert idx.draft([*text, 4, 6, 6, 2, 3], 2) == [4, 6]  # (2, 3) latest at 11..12, followed by 4 6


def test_lookup_index_grows_with_the_sequence_and_prefers_recent_matches() -> None:
    idx = NgramIndex(2, 2)
    assert idx.draft([5, 6, 1, 5, 6], 3) == [1, 5, 6]
    seq2 = [5, 6, 1, 5, 6, 2, 0, 5, 6]
    assert idx.draft(seq2, 2) == [2, 0]  # the latest occurrence of (5, 6) before the tail, not the first
    assert idx.draft([*seq2, 3], 1) == []


def test_lookup_draft_that_runs_into_the_tail_drafts_the_loop_on() -> None:
    idx = NgramIndex(2, 2)
    # (1, 2) at 0..1 is followed by 1 2, then the sequence ends: a loop of period 2, drafted on to the k asked
    assert idx.draft([1, 2, 1, 2], 8) == [1, 2, 1, 2, 1, 2, 1, 2]
    assert NgramIndex(2, 3).draft([5, 9, 9, 9], 4) == [9, 9, 9, 9]  # a token repeated: period 1
    assert NgramIndex(2, 3).draft([4, 1, 2, 3, 1, 2, 3, 1], 5) == [2, 3, 1, 2, 3]  # (3, 1) recurs every 3


def test_ngram_source_keeps_one_index_per_slot() -> None:
    src = NgramSource(2, 3)
    src.start(0, [1, 2, 3, 1, 2])
    src.start(1, [4, 5, 6, 4, 5])
    assert src.propose([Ask(0, [1, 2, 3, 1, 2], 1), Ask(1, [4, 5, 6, 4, 5], 2)]) == [[3], [6, 4]]
    src.stop(0)
    src.start(0, [7, 8, 7])
    assert src.propose([Ask(0, [7, 8, 7, 8], 3)]) == [[7, 8, 7]]


def test_acceptance_is_counted_per_drafted_position() -> None:
    t = Track(8, hits=0.0, trials=0.0)
    t.draft = [1, 2, 3, 4]
    t.settle(4)
    assert (t.drafted, t.accepted, t.draft) == (4, 4, [])
    assert t.p == pytest.approx(1.0)  # four kept, none rejected
    t.draft = [1] * 8
    t.settle(3)  # three kept, then one rejected: 7 of 8 positions' verdicts, weighted toward the recent
    assert (t.drafted, t.accepted) == (12, 7)
    assert t.p == pytest.approx((0.9 * 4 + 3) / (0.9 * 4 + 4))


def test_pass_cost_is_fitted_from_passes_of_different_sizes() -> None:
    cost = PassCost()
    cost.observe(1, 0.1)
    assert cost.share(1) == 0.0  # one size seen: nothing known about another token's cost
    for n in (1, 3, 9, 2, 5):
        cost.observe(n, 0.05 + 0.05 * n)  # a = b = 50 ms
    assert cost.share(1) == pytest.approx(0.5)  # 50 ms more on a 100 ms pass
    assert cost.share(9) == pytest.approx(0.1)


def test_drafts_are_sized_by_what_they_are_expected_to_gain() -> None:
    sure, unsure = Track(8, hits=9.5, trials=10.0), Track(8, hits=1.0, trials=5.0)
    assert sure.worth(8, 0.0, 1) == unsure.worth(8, 0.0, 1) == 8  # free drafts: as many as allowed
    assert 1 <= sure.worth(8, 0.5, 1) < 8  # costly drafts: fewer, even when they are likely right
    picks = [unsure.worth(8, 0.3, 1) for _ in range(PROBE)]
    assert picks == [0] * (PROBE - 1) + [1]  # not worth it: none, but a probe now and then
    assert sure.worth(8, 0.3, 8) == 0  # in a step of 8 answers one answer's drafts slow seven others
    # a token costing as much as the step's own share of one (a draft model nearly as slow as the model): even
    # drafts that are always right lose, so not even a probe (which, with a draft model, prefills its prompt)
    assert [sure.worth(8, 1.2, 1) for _ in range(2 * PROBE)] == [0] * (2 * PROBE)
    assert [sure.worth(8, 0.3, 4) for _ in range(2 * PROBE)] == [0] * (2 * PROBE)
    unsure.draft = [5]
    unsure.settle(1)
    assert unsure.p > 0.2


def seq(rid: str, slot: int, prompt: tuple[int, ...], params: SamplingParams | None = None) -> Sequence:
    s = Sequence(Request(rid, prompt, params or SamplingParams(temperature=0.0)), slot=slot, chain=None)
    s.n_cached = len(prompt) - 1  # decoding: its last token is the next to feed
    return s


CFG = SpeculativeConfig(mode="ngram", max_draft=4, max_batch=2)


def test_step_rule_drafts_within_the_budget_and_not_when_many_decode() -> None:
    spec = Speculator(CFG, n_ctx_per_seq=100)
    a, b, c = (seq(x, i, (1, 2, 3, 4, 5, 6, 1, 2)) for i, x in enumerate("abc"))
    for s in (a, b):
        spec.admit(s)
    spec.draft([a, b], budget=7)  # 2 decoding tokens, 5 left: a drafts 4, b the 1 left
    assert a.spec is not None and b.spec is not None
    assert (a.spec.draft, b.spec.draft) == ([3, 4, 5, 6], [3])
    plan = schedule([a, b], budget=7)
    assert [(s.request_id, n) for s, n in plan] == [("a", 5), ("b", 2)]
    assert a.feed(5) == [2, 3, 4, 5, 6]
    a.spec.draft, b.spec.draft = [], []
    spec.admit(c)
    spec.draft([a, b, c], budget=64)  # 3 decoding > max_batch 2: nobody drafts
    assert a.n_draft == b.n_draft == c.n_draft == 0


def test_a_rejection_neither_trims_the_next_draft_nor_pauses_drafting_where_drafts_are_cheap() -> None:
    # copying work: a miss (a changed word) is followed by long runs again, so the next draft stays full length
    spec = Speculator(SpeculativeConfig(mode="ngram", max_draft=5, draft_cost=0.02), n_ctx_per_seq=100)
    a = seq("a", 0, (1, 2, 3, 4, 5, 6, 7, 1, 2))
    spec.admit(a)
    assert a.spec is not None
    a.spec.hits, a.spec.trials = 19.0, 20.0  # it kept nearly all its drafts so far
    for kept in (3, 0):  # three of five kept (the old rule then drafted 4), then a draft rejected outright
        spec.draft([a], budget=64)
        assert a.spec.draft == [3, 4, 5, 6, 7]
        a.spec.settle(kept)
    spec.draft([a], budget=64)
    assert a.spec.draft == [3, 4, 5, 6, 7]


def test_pass_cost_counts_only_the_passes_of_steps_where_drafts_are_decided() -> None:
    spec = Speculator(CFG, n_ctx_per_seq=100)  # max_batch 2
    many = [seq(x, i, (1, 2, 3)) for i, x in enumerate("abc")]
    spec.observe([(s, 1) for s in many], 0.05)  # 3 answers decoding: nobody drafts in such a step
    assert spec.cost.fit() is None
    spec.observe([(many[0], 1)], 0.01)
    assert spec.cost.fit() == pytest.approx((0.01, 0.0))


def test_drafts_stop_short_of_max_tokens_and_the_context() -> None:
    spec = Speculator(CFG, n_ctx_per_seq=11)
    a = seq("a", 0, (1, 2, 3, 4, 5, 6, 1, 2), SamplingParams(temperature=0.0, max_tokens=3))
    spec.admit(a)
    spec.draft([a], budget=64)
    assert a.n_draft == 2  # 3 tokens left: 2 drafts and the token after them
    b = seq("b", 1, (1, 2, 3, 4, 5, 6, 1, 2))
    spec.admit(b)
    spec.draft([b], budget=64)
    assert b.n_draft == 2  # positions 8..9 for the drafts: the context per sequence ends at 11


def test_requests_that_opt_out_or_score_prompts_never_speculate() -> None:
    spec = Speculator(CFG, n_ctx_per_seq=100)
    for p in (SamplingParams(speculative=False), SamplingParams(prompt_logprobs=True, max_tokens=1, logprobs=True)):
        s = seq("x", 0, (1, 2, 1, 2), p)
        spec.admit(s)
        assert s.spec is None


def test_an_answer_with_a_reasoning_budget_never_speculates() -> None:
    spec = Speculator(CFG, n_ctx_per_seq=100)
    s = seq("x", 0, (1, 2, 1, 2))
    s.budget = ThinkBudget(limit=4, think=("<think>", "</think>"), close_ids=(7,))
    spec.admit(s)
    assert s.spec is None


@pytest.mark.parametrize(("kw", "key"), [({"max_draft": 0}, "speculative.max_draft"),
                                         ({"max_draft": MAX_DRAFT_LIMIT + 1}, "speculative.max_draft"),
                                         ({"ngram_min": 3, "ngram_max": 2}, "ngram_min"),
                                         ({"max_batch": 0}, "speculative.max_batch"),
                                         ({"mode": "eagle"}, "speculative.mode")])
def test_settings_out_of_range_name_the_key(kw: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        SpeculativeConfig(**kw)  # type: ignore[arg-type]


def test_yaml_off_is_the_mode_off(tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text("speculative:\n  mode: off\n  max_draft: 4\n", encoding="utf-8")  # YAML reads off as false
    assert load_config(config).speculative.mode == "off"
