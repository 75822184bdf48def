"""The consistency metrics: agreement, first divergence, logprob differences, summaries and the verdict."""

from __future__ import annotations

import math

import pytest

from llamafleet.consistency.compare import (
    CPU_THRESHOLDS,
    Answer,
    Thresholds,
    abs_logprob_diffs,
    common_prefix,
    compare,
    compare_all,
    first_divergence,
    judge,
    summarize,
    token_agreement,
)


def ans(tokens: list[int], logprobs: list[float] | None = None) -> Answer:
    return Answer(tuple(tokens), tuple(logprobs if logprobs is not None else [-0.5] * len(tokens)))


@pytest.mark.parametrize(
    ("ref", "other", "prefix", "div", "agree"),
    [
        ([1, 2, 3, 4], [1, 2, 3, 4], 4, None, 1.0),
        ([1, 2, 3, 4], [1, 2, 9, 4], 2, 2, 0.5),
        ([1, 2, 3, 4], [7, 2, 3, 4], 0, 0, 0.0),
        ([1, 2, 3, 4], [1, 2], 2, 2, 0.5),  # the other stopped early
        ([1, 2], [1, 2, 3, 4], 2, 2, 1.0),  # the other ran on: all of the reference is shared
        ([], [], 0, None, 1.0),
        ([], [5], 0, 0, 0.0),
    ],
)
def test_prefix_divergence_and_agreement(ref: list[int], other: list[int], prefix: int, div: int | None,
                                         agree: float) -> None:
    assert common_prefix(ref, other) == prefix
    assert first_divergence(ref, other) == div
    assert token_agreement(ref, other) == pytest.approx(agree)


def test_logprob_diffs_are_absolute_and_cover_only_the_prefix() -> None:
    assert abs_logprob_diffs([-0.1, -1.0, -2.0], [-0.2, -0.5, -9.0], 2) == pytest.approx([0.1, 0.5])
    assert abs_logprob_diffs([-1.0], [-1.0], 0) == []
    with pytest.raises(ValueError, match="cannot compare 3 logprobs"):
        abs_logprob_diffs([-1.0, -1.0], [-1.0, -1.0, -1.0], 3)


def test_non_finite_logprob_differences_count_as_infinite() -> None:
    assert abs_logprob_diffs([math.nan, -1.0], [-1.0, math.nan], 2) == [math.inf, math.inf]
    assert abs_logprob_diffs([-math.inf], [-1.0], 1) == [math.inf]
    assert abs_logprob_diffs([-math.inf], [-math.inf], 1) == [0.0]


def test_answer_needs_one_logprob_per_token() -> None:
    with pytest.raises(ValueError, match="3 tokens, 2 logprobs"):
        Answer((1, 2, 3), (-0.1, -0.2))


def test_compare_one_prompt() -> None:
    ref = ans([10, 11, 12, 13, 14], [-0.1, -0.2, -0.3, -0.69, -0.4])
    other = ans([10, 11, 12, 99, 14], [-0.1, -0.25, -0.31, -0.70, -0.4])
    c = compare(3, ref, other)
    assert c.prompt == 3 and not c.exact
    assert (c.ref_tokens, c.other_tokens, c.shared, c.divergence) == (5, 5, 3, 3)
    assert c.agreement == pytest.approx(0.6)
    assert c.max_abs_dlogprob == pytest.approx(0.05)  # position 3 (after the divergence) is not counted
    assert c.mean_abs_dlogprob == pytest.approx((0.0 + 0.05 + 0.01) / 3)
    assert (c.ref_logprob_at_divergence, c.other_logprob_at_divergence) == (-0.69, -0.70)


def test_compare_exact_and_prefix_cases() -> None:
    same = compare(0, ans([1, 2, 3]), ans([1, 2, 3]))
    assert same.exact and same.divergence is None and same.agreement == 1.0
    assert same.max_abs_dlogprob == 0.0 and same.ref_logprob_at_divergence is None
    short = compare(0, ans([1, 2, 3], [-1.0, -2.0, -3.0]), ans([1, 2], [-1.0, -2.0]))
    assert short.divergence == 2 and short.ref_logprob_at_divergence == -3.0
    assert short.other_logprob_at_divergence is None  # the other answer has no token there
    nothing = compare(0, ans([5, 6]), ans([7, 6]))
    assert nothing.shared == 0 and nothing.max_abs_dlogprob is None and nothing.mean_abs_dlogprob is None


def test_summary_over_prompts() -> None:
    ref = [ans([1, 2, 3, 4]), ans([5, 6, 7, 8]), ans([9, 9]), ans([3, 3, 3, 3])]
    other = [
        ans([1, 2, 3, 4], [-0.5, -0.5, -0.5, -0.6]),  # exact; one token off by 0.1
        ans([5, 6, 0, 0], [-0.5, -0.52, -0.5, -0.5]),  # diverges at 2
        ans([9, 9]),  # exact
        ans([0, 3, 3, 3]),  # diverges at 0: nothing shared
    ]
    s = summarize(compare_all(ref, other))
    assert s.prompts == 4 and s.diverged == 2
    assert s.exact_match_rate == pytest.approx(0.5)
    assert s.agreement_mean == pytest.approx((1.0 + 0.5 + 1.0 + 0.0) / 4)
    assert s.agreement_min == 0.0
    assert (s.first_divergence_min, s.first_divergence_mean) == (0, pytest.approx(1.0))
    assert s.max_abs_dlogprob == pytest.approx(0.1)
    assert s.compared_tokens == 4 + 2 + 2
    assert s.mean_abs_dlogprob == pytest.approx((0.1 + 0.02) / 8)  # weighted by token, not by prompt


def test_summary_when_everything_matches() -> None:
    s = summarize(compare_all([ans([1, 2])] * 3, [ans([1, 2])] * 3))
    assert (s.exact_match_rate, s.agreement_mean, s.diverged) == (1.0, 1.0, 0)
    assert s.first_divergence_min is None and s.first_divergence_mean is None
    assert s.max_abs_dlogprob == 0.0 == s.mean_abs_dlogprob


def test_compare_all_and_summarize_refuse_mismatched_input() -> None:
    with pytest.raises(ValueError, match="reference has 2 answers but the configuration has 1"):
        compare_all([ans([1]), ans([2])], [ans([1])])
    with pytest.raises(ValueError, match="no prompts"):
        summarize([])


def test_judge_names_every_missed_threshold() -> None:
    ref = [ans([1, 2, 3, 4])] * 10
    good = [ans([1, 2, 3, 4], [-0.5, -0.5, -0.5, -0.53])] * 10
    assert judge(summarize(compare_all(ref, good)), CPU_THRESHOLDS) == []
    bad = [ans([1, 2, 9, 9], [-0.5, -0.7, -0.5, -0.5])] * 2 + [ans([1, 2, 3, 4])] * 8
    failures = judge(summarize(compare_all(ref, bad)), CPU_THRESHOLDS)
    assert failures == [
        "exact-match rate 0.800 < 0.900",
        "mean token agreement 0.900 < 0.950",
        "max |dlogprob| 0.2 > 0.05",
    ]
    loose = Thresholds(min_exact_match=0.8, min_agreement_mean=0.9, max_abs_dlogprob=0.2)
    assert judge(summarize(compare_all(ref, bad)), loose) == []  # bounds are inclusive


def test_nan_logprobs_always_fail() -> None:
    ref = [ans([1, 2], [-0.1, -0.2])]
    broken = [ans([1, 2], [math.nan, math.nan])]
    s = summarize(compare_all(ref, broken))
    assert s.exact_match_rate == 1.0 and s.max_abs_dlogprob == math.inf
    lenient = Thresholds(min_exact_match=0.0, min_agreement_mean=0.0, max_abs_dlogprob=1e9)
    assert judge(s, lenient) == ["max |dlogprob| inf > 1e+09"]


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"min_exact_match": 1.5}, "min_exact_match must be between 0 and 1"),
        ({"min_agreement_mean": -0.1}, "min_agreement_mean must be between 0 and 1"),
        ({"max_abs_dlogprob": -1.0}, "max_abs_dlogprob must be >= 0"),
        ({"max_abs_dlogprob": math.nan}, "max_abs_dlogprob must be >= 0"),
    ],
)
def test_thresholds_are_validated(kw: dict[str, float], msg: str) -> None:
    base = {"min_exact_match": 0.9, "min_agreement_mean": 0.9, "max_abs_dlogprob": 0.1}
    with pytest.raises(ValueError, match=msg):
        Thresholds(**{**base, **kw})
