"""Ranking by time-to-target T = R / Θ (docs/method.md §1, §5)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchtune.analysis.decide.ranking import expected_time, rank_time_to_target
from batchtune.errors import AnalysisError

# docs/method.md §1 worked example (Tencent Hunyuan, GRPO, Qwen3-30B-A3B, G=8). The reference took 11.90 h.
R0 = 122_880.0  # responses to target at the reference
THETA0 = R0 / (11.90 * 3600)  # responses/s, so that T0 = 11.90 h
EXAMPLE = dict(
    names=["512x8", "1024x8", "2048x8", "4096x8", "2048x8-fixed-lr"],
    batch_responses=[4096, 8192, 16384, 32768, 16384],
    samples_to_target=[R0, R0, 1.6 * R0, 1.6 * R0, 1.667 * R0],
    responses_per_s=[THETA0, 1.41 * THETA0, 1.30 * THETA0, 1.36 * THETA0, 1.17 * THETA0],
)


def rank(names, batch, r, thr, *, spread=0.1, reference=None, lo=None, hi=None):
    r = np.asarray(r, dtype=float)
    lo = r * (1 - spread) if lo is None else lo
    hi = r * (1 + spread) if hi is None else hi
    return rank_time_to_target(names, batch, r, lo, hi, thr, reference=reference or names[0])


def example(spread: float = 0.1):
    e = EXAMPLE
    return rank(
        e["names"], e["batch_responses"], e["samples_to_target"], e["responses_per_s"],
        spread=spread,
    )  # fmt: skip


def test_method_worked_example_ratios_and_winner():
    ranking = example()
    ratios = {c.name: round(c.time_ratio, 2) for c in ranking.candidates}
    assert ratios == {
        "512x8": 1.00,
        "1024x8": 0.71,
        "2048x8": 1.23,
        "4096x8": 1.18,
        "2048x8-fixed-lr": 1.42,
    }
    assert ranking.winner == "1024x8"
    assert ranking.reference == "512x8"
    assert [c.name for c in ranking.candidates] == [
        "1024x8",
        "512x8",
        "4096x8",
        "2048x8",
        "2048x8-fixed-lr",
    ]
    winner = ranking.by_name("1024x8")
    assert winner.time_to_target_s / 3600 == pytest.approx(8.44, abs=0.005)  # 11.90 h -> 8.44 h
    assert winner.sample_ratio == pytest.approx(1.0)
    assert winner.throughput_ratio == pytest.approx(1.41)


def test_method_worked_example_reason():
    reason = example().reason
    assert reason.startswith(
        "1024x8 reaches the target with 1.00x the reference's responses at 1.41x its "
        "throughput: 0.71x the time."
    )
    assert "Larger batches (2048x8) need 1.60x the responses for 1.30x the throughput" in reason
    assert "Within uncertainty" not in reason


def test_invariants_on_random_candidates():
    rng = np.random.default_rng(0)
    n = 8
    names = [f"b{i}" for i in range(n)]
    batch = 2.0 ** np.arange(8, 8 + n)
    r = rng.uniform(1e5, 4e5, n)
    thr = rng.uniform(5.0, 20.0, n)
    ranking = rank(names, batch, r, thr, spread=0.2, reference="b0")
    times = [c.time_to_target_s for c in ranking.candidates]
    assert times == sorted(times)
    assert [c.rank for c in ranking.candidates] == list(range(1, n + 1))
    for c in ranking.candidates:
        assert c.time_to_target_s == pytest.approx(c.samples_to_target / c.responses_per_s)
        assert c.time_ratio == pytest.approx(c.sample_ratio / c.throughput_ratio)
        assert c.time_ratio_ci[0] <= c.time_ratio <= c.time_ratio_ci[1]
        assert c.time_ci_s[0] <= c.time_to_target_s <= c.time_ci_s[1]
    ref = ranking.by_name("b0")
    assert ref.is_reference and ref.time_ratio == 1.0 and ref.time_ratio_ci == (1.0, 1.0)
    assert sum(c.is_reference for c in ranking.candidates) == 1


def test_censored_candidates_rank_last():
    names = ["small", "mid", "big", "huge"]
    r = [1e5, math.inf, 1.2e5, math.inf]
    lo = [0.9e5, 3e5, 1.1e5, 2e5]  # censored: samples consumed without reaching the target
    hi = [1.1e5, math.inf, 1.3e5, math.inf]
    thr = [10.0, 100.0, 15.0, 200.0]  # censored runs are fast, and still rank last
    ranking = rank_time_to_target(names, [1, 2, 4, 8], r, lo, hi, thr, reference="small")
    assert [c.name for c in ranking.candidates] == ["big", "small", "huge", "mid"]
    huge = ranking.by_name("huge")
    assert huge.censored and math.isinf(huge.time_to_target_s) and math.isinf(huge.time_ratio)
    assert huge.time_ci_s == (1000.0, math.inf)
    assert 0 < huge.time_ratio_ci[0] < huge.time_ratio_ci[1] == math.inf
    assert "Never reached the target" in ranking.reason and "huge" in ranking.reason


def test_ties_within_uncertainty_are_named():
    ranking = rank(["a", "b"], [1024, 2048], [1e5, 1.5e5], [10.0, 14.0], spread=0.3)
    assert ranking.winner == "a"
    assert "Within uncertainty of b" in ranking.reason


def test_equal_time_goes_to_the_smaller_batch():
    ranking = rank(["big", "small"], [2048, 1024], [2e5, 1e5], [20.0, 10.0], reference="small")
    assert ranking.winner == "small"


def test_winner_at_the_largest_batch_says_so():
    ranking = rank(["a", "b"], [1024, 2048], [1e5, 1.1e5], [10.0, 19.0], spread=0.01)
    assert ranking.winner == "b"
    assert "a larger one may be faster still" in ranking.reason
    # none larger was measured: not "no larger batch reached the target", which says one was tried
    assert "No larger batch was measured in this sweep" in ranking.reason


def test_a_larger_batch_that_never_reached_the_target_is_said_so():
    r, lo, hi = [1e5, 1.1e5, math.inf], [0.9e5, 1e5, 2e5], [1.1e5, 1.2e5, math.inf]  # c: censored
    ranking = rank_time_to_target(
        ["a", "b", "c"], [1024, 2048, 4096], r, lo, hi, [10.0, 19.0, 30.0], reference="a"
    )
    assert ranking.winner == "b"
    assert "No larger batch reached the target in this sweep" in ranking.reason


def test_reference_winner():
    ranking = rank(["a", "b"], [1024, 2048], [1e5, 2e5], [10.0, 12.0], spread=0.01)
    assert ranking.winner == "a"
    assert ranking.reason.startswith("a (the reference) reaches the target soonest.")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(reference="nope"),
        dict(r=[np.nan, 1e5]),
        dict(r=[0.0, 1e5]),
        dict(thr=[0.0, 10.0]),
        dict(thr=[10.0]),
        dict(names=["a", "a"]),
        dict(lo=[2e5, 0.9e5]),  # ci_low above the estimate
    ],
)
def test_degenerate_inputs_raise(kwargs):
    args = dict(names=["a", "b"], batch=[1024, 2048], r=[1e5, 1e5], thr=[10.0, 12.0])
    args.update({k: v for k, v in kwargs.items() if k in args})
    extra = {k: v for k, v in kwargs.items() if k not in args}
    with pytest.raises(AnalysisError):
        rank(args["names"], args["batch"], args["r"], args["thr"], **extra)


def test_censored_reference_raises():
    with pytest.raises(AnalysisError, match="reference 'a' never reached"):
        rank_time_to_target(
            ["a", "b"], [1, 2], [math.inf, 1e5], [5e4, 9e4], [math.inf, 1.1e5], [1.0, 1.0],
            reference="a",
        )  # fmt: skip


def test_empty_raises():
    with pytest.raises(AnalysisError):
        rank_time_to_target([], [], [], [], [], [], reference="a")


def test_expected_time_is_the_point_for_a_symmetric_interval_and_moves_with_skew():
    t = 100.0
    sym = (math.log(1.1), math.log(1.1))
    assert expected_time(t, sym, 0.9) == pytest.approx(t)
    up = expected_time(t, (0.02, 0.2), 0.9)
    down = expected_time(t, (0.2, 0.02), 0.9)
    assert down < t < up
    # the split normal's mean: mode + sqrt(2/pi) (sigma_up - sigma_down), sigma = half-width / z
    assert math.log(up / t) == pytest.approx(math.sqrt(2 / math.pi) * 0.18 / 1.6448536, rel=1e-6)
    assert expected_time(t, (0.1, math.inf), 0.9) == t  # open above: unknown, no skew shift
    assert expected_time(t, (0.1, math.inf), 0.9, open_margin=0.1) == pytest.approx(1.1 * t)
    assert expected_time(t, sym, 0.9, open_margin=0.1) == pytest.approx(t)  # only an open interval
    assert expected_time(math.inf, (math.inf, math.inf), 0.9) == math.inf


def test_a_fast_median_with_seeds_skewed_slow_ranks_behind_a_tight_one():
    # NQM lr0.015 (benchmarks/out/regret.txt): 1024's six seeds read 23.5k-30.3k samples, median
    # 25.2k, truth 30.0k; 512's read 23.4k-24.1k. By the median 1024 looks 0.6% faster.
    ranking = rank(
        ["P64xG8", "P128xG8"], [512, 1024], [24111, 25199], [70.35, 73.94],
        lo=np.array([23439, 24259]), hi=np.array([24112, 29108]),
    )  # fmt: skip
    by = {c.name: c for c in ranking.candidates}
    assert by["P128xG8"].time_to_target_s < by["P64xG8"].time_to_target_s
    assert by["P128xG8"].expected_time_s > by["P64xG8"].expected_time_s
    assert ranking.winner == "P64xG8"
    assert "P128xG8 has the lowest median time" in ranking.reason
    assert "skewed slow" in ranking.reason


def test_an_interval_open_above_is_ranked_by_its_point_not_thrown_away():
    # a branched probe's short windows leave some branches censored: the upper bound is open, which
    # says "unknown", not "never" (ranking.py's module doc)
    ranking = rank(
        ["a", "b", "c", "d"], [8, 16, 32, 64], [100, 50, 60, math.inf], [1, 1, 1, 1],
        lo=np.array([95, 45, 55, 70]), hi=np.array([105, math.inf, 66, math.inf]),
    )  # fmt: skip
    assert [c.name for c in ranking.candidates] == ["b", "c", "a", "d"]
    assert ranking.by_name("b").expected_time_s == ranking.by_name("b").time_to_target_s
    assert ranking.by_name("d").expected_time_s == math.inf


def test_a_winner_skewed_fast_is_named_as_the_reason_not_the_fastest_median():
    # b's median is 1% faster with a symmetric interval; a's interval is skewed down (its seeds
    # that differ were faster), so its expected time is lower: the reason must not call b skewed slow
    ranking = rank(
        ["a", "b"], [8, 16], [100, 99], [1, 1],
        lo=np.array([70, 94]), hi=np.array([101, 104]),
    )  # fmt: skip
    assert ranking.winner == "a"
    assert "b has the lowest median time" in ranking.reason
    assert "the winner's seeds are skewed fast" in ranking.reason
    assert "its seeds are skewed slow" not in ranking.reason


def test_a_lower_bound_must_beat_a_measured_candidate_by_more_than_the_margin():
    # branched_cost --seed-pairs, pair 2,3 (stop 21): 512's geometric mean held a censored seed at its
    # bound and tied 256 in time (0.2% faster); ranked by the bare point it won at true regret 1.52
    names, batch, thr = ["P32xG8", "P64xG8"], [256, 512], [64.16, 70.40]
    r = [13713, 15020]
    lo, hi = np.array([13000, 13500]), np.array([13713**2 / 13000, math.inf])  # 256: symmetric
    bare = rank(names, batch, r, thr, lo=lo, hi=hi)
    assert bare.winner == "P64xG8"  # the old order: the bound, read as a point, is 0.2% faster
    ranking = rank_time_to_target(names, batch, r, lo, hi, thr, reference="P32xG8", open_margin=0.1)
    assert ranking.winner == "P32xG8"
    assert "P64xG8 has the lowest median time" in ranking.reason
    assert "open above" in ranking.reason
    # a bound that wins by more than the margin still wins: the margin is a tie-break, not a veto
    lo_far = np.array([13000, 11000])
    far = rank_time_to_target(
        names, batch, [13713, 12000], lo_far, hi, thr, reference="P32xG8", open_margin=0.1
    )
    assert far.winner == "P64xG8"


def test_regret_bound_says_how_much_faster_another_candidate_could_be():
    names, batch, thr = ["a", "b", "c"], [8, 16, 32], [1.0, 1.9, 3.0]
    r = np.array([100.0, 100.0, 200.0])  # T: 100, 52.6, 66.7 -> b wins
    tight = rank(names, batch, r, thr, spread=0.01)
    assert tight.winner == "b" and tight.regret_high == 1.0 and tight.regret_against is None
    # c's interval reaches 40% below its point: c could be 66.7 * 0.6 / 52.6 = 0.76x the winner's time
    lo, hi = r * np.array([0.99, 0.99, 0.6]), r * np.array([1.01, 1.01, 1 / 0.6])
    wide = rank(names, batch, r, thr, lo=lo, hi=hi)
    assert wide.winner == "b" and wide.regret_against == "c"
    _, hw_b = math.log(1 / 0.99), math.log(1.01)
    expect = (52.63 / 66.67) * math.exp(math.hypot(math.log(1 / 0.6), hw_b))
    assert wide.regret_high == pytest.approx(expect, rel=1e-3) and wide.regret_high > 1.2
    # the winner's own interval open above: it could be any slower
    open_w = rank(names, batch, r, thr, lo=r * 0.99, hi=np.array([101.0, math.inf, 202.0]))
    assert open_w.winner == "b" and math.isinf(open_w.regret_high)
    # a candidate that never reached the target counts at the lower bound of its time
    cens = rank(names, [8, 16, 64], [100.0, 100.0, math.inf], [1.0, 1.9, 6.0],
                lo=np.array([99.0, 99.0, 150.0]), hi=np.array([101.0, 101.0, math.inf]))  # fmt: skip
    assert cens.winner == "b" and cens.regret_against == "c"
    assert cens.regret_high == pytest.approx((100 / 1.9) / (150 / 6.0) * (101 / 100), rel=1e-6)
