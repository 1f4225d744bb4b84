"""Curves: envelope invariants, crossing recovery, censoring, seed aggregation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchtune.analysis.sample.curves import (
    TargetCrossing,
    clean_curve,
    confirmed_crossing,
    curve_at,
    ema,
    monotone_envelope,
    samples_to_target,
)
from batchtune.analysis.sample.seeds import (
    GEOMETRIC_MEAN,
    TargetEstimate,
    estimate_from_value,
    estimate_over_seeds,
)
from batchtune.errors import AnalysisError


def _reward(s: np.ndarray, s0: float = 1000.0) -> np.ndarray:
    return 1.0 - np.exp(-s / s0)


def test_ema_matches_recursion_and_alpha_edges_do_nothing():
    x = np.array([1.0, 3.0, 2.0, 5.0])
    want, acc = [], x[0]
    for v in x:
        acc = 0.3 * v + 0.7 * acc
        want.append(acc)
    np.testing.assert_allclose(ema(x, 0.3), want)
    np.testing.assert_array_equal(ema(x, 0.0), x)
    np.testing.assert_array_equal(ema(x, 1.0), x)
    with pytest.raises(AnalysisError):
        ema(x, 1.5)


@pytest.mark.parametrize("higher", [True, False])
def test_envelope_is_monotone_and_sorted_with_nan_dropped(higher):
    rng = np.random.default_rng(0)
    s = rng.permutation(np.arange(200.0))
    m = rng.normal(size=200)
    m[[3, 50]] = np.nan
    env = monotone_envelope(s, m, higher_is_better=higher)
    xs, _ = clean_curve(s, m)
    assert env.shape == xs.shape == (198,)
    assert np.all(np.diff(xs) >= 0)
    d = np.diff(env)
    assert np.all(d >= 0) if higher else np.all(d <= 0)


def test_noiseless_crossing_is_exact():
    s = np.linspace(0, 5000, 51)
    target = 0.8
    got = samples_to_target(s, _reward(s), target)
    # The monotone cubic through the points recovers the concave curve's crossing (1000 ln 5)
    # far better than a chord would (0.2% late here).
    assert not got.censored and got.method == "isotonic"
    assert got.samples_to_target == pytest.approx(1000.0 * math.log(5.0), rel=2e-4)
    assert got.max_samples == 5000 and got.noise_sd is not None
    # On a linear curve the crossing is exactly the true one.
    lin = samples_to_target([0, 100, 200], [0.0, 0.5, 1.0], 0.7)
    assert lin.samples_to_target == pytest.approx(140.0)
    # The former estimator: linear interpolation between the two bracketing points.
    old = samples_to_target(s, _reward(s), target, ema_alpha=1.0, method="running_best")
    i = int(np.argmax(_reward(s) >= target))
    e0, e1 = _reward(s[i - 1 : i + 1])
    want = s[i - 1] + (target - e0) / (e1 - e0) * (s[i] - s[i - 1])
    assert old.samples_to_target == pytest.approx(want, rel=1e-12)


def test_lower_is_better_crossing():
    s, loss = [0, 10, 20], [3.0, 2.0, 1.0]
    got = samples_to_target(s, loss, 1.5, higher_is_better=False)
    assert got.samples_to_target == pytest.approx(15.0)
    # The former estimator's EMA lags: smoothed 3, 2.5, 1.75 never gets down to 1.5 (censored).
    assert samples_to_target(s, loss, 1.5, higher_is_better=False, method="running_best").censored


def test_isotonic_is_not_fooled_by_one_lucky_point():
    """A noise spike above the target early on moves the isotonic crossing by little; the
    running best crosses at the spike."""
    s = np.arange(1.0, 201.0)
    m = s / 200.0
    m[20] = 0.9  # a lucky point at s = 21, target 0.8 (true crossing at 160)
    iso = samples_to_target(s, m, 0.8)
    best = samples_to_target(s, m, 0.8, ema_alpha=1.0, method="running_best")
    assert iso.samples_to_target == pytest.approx(160.0, rel=0.05)
    assert best.samples_to_target < 25.0


def test_noisy_crossing_within_five_percent():
    truth = 1000.0 * math.log(5.0)  # 1 - exp(-s/1000) = 0.8
    for seed in range(5):
        rng = np.random.default_rng(seed)
        s = np.linspace(0, 5000, 1001)
        m = _reward(s) + rng.normal(0, 0.005, s.size)
        got = samples_to_target(s, m, 0.8)
        assert got.samples_to_target == pytest.approx(truth, rel=0.05)


def test_censored_and_first_point():
    s = np.array([10.0, 20.0, 30.0])
    never = samples_to_target(s, [0.1, 0.2, 0.3], 0.9)
    assert (never.samples_to_target, never.censored, never.max_samples) == (None, True, 30.0)
    first = samples_to_target(s, [0.95, 0.97, 0.99], 0.9)
    assert first.samples_to_target == 10.0 and not first.censored
    # One high first point followed by low ones is noise: pooled, the fit crosses later.
    assert samples_to_target(s, [0.95, 0.2, 0.99], 0.9).samples_to_target > 10.0


def test_degenerate_curves_raise():
    with pytest.raises(AnalysisError):
        samples_to_target([1, 2], [np.nan, np.nan], 0.5)
    with pytest.raises(AnalysisError):
        samples_to_target([1, np.nan], [0.1, 0.2], 0.5)
    with pytest.raises(AnalysisError):
        samples_to_target([1, 2, 3], [0.1, 0.2], 0.5)
    with pytest.raises(AnalysisError):
        samples_to_target([1, 2], [0.1, 0.2], math.nan)
    with pytest.raises(AnalysisError):
        TargetCrossing(None, False, 10.0)


def test_curve_at_interpolates_and_refuses_to_extrapolate():
    s = np.array([0.0, 100.0, 200.0])
    out = curve_at(s, [0.0, 0.5, 1.0], [50.0, 150.0, 250.0, -1.0], ema_alpha=1.0)
    np.testing.assert_allclose(out[:2], [0.25, 0.75])
    assert np.isnan(out[2]) and np.isnan(out[3])


def test_median_recovery_and_one_seed():
    vals = [300.0, 100.0, 200.0, 500.0, 400.0]
    est = estimate_over_seeds([TargetCrossing(v, False, 1e4) for v in vals])
    assert est.samples_to_target == 300.0
    assert est.ci_low <= 300.0 <= est.ci_high and est.has_spread
    assert est.n_seeds == 5 and est.n_censored == 0
    one = estimate_over_seeds([TargetCrossing(250.0, False, 1e4)])
    assert one.ci_low == one.ci_high == one.samples_to_target == 250.0
    assert not one.has_spread


def test_bootstrap_ci_covers_truth_in_simulation():
    rng = np.random.default_rng(1)
    median_true, hits, trials = 1000.0, 0, 200
    for t in range(trials):
        vals = median_true * np.exp(rng.normal(0.0, 0.3, 9))
        est = estimate_over_seeds([TargetCrossing(float(v), False, 1e6) for v in vals], n_boot=500, seed=t)
        hits += est.ci_low <= median_true <= est.ci_high
    assert hits / trials >= 0.8  # nominal 0.9; percentile bootstrap of a median runs a bit low


def test_censoring_counts_as_later_than_observed():
    c = [TargetCrossing(100.0, False, 1e3), TargetCrossing(None, True, 150.0)]
    half = estimate_over_seeds(c + [TargetCrossing(200.0, False, 1e3), TargetCrossing(None, True, 90.0)])
    assert math.isinf(half.samples_to_target) and math.isinf(half.ci_high)
    assert half.n_censored == 2 and half.censored_at == (None, 150.0, None, 90.0)
    minority = estimate_over_seeds(c + [TargetCrossing(120.0, False, 1e3)])
    assert minority.samples_to_target == 120.0 and math.isinf(minority.ci_high)
    allc = estimate_over_seeds([TargetCrossing(None, True, 50.0)] * 3)
    assert math.isinf(allc.samples_to_target) and allc.n_censored == 3


def test_the_geometric_mean_over_seeds_counts_a_heavy_tail_the_median_hides():
    """Three seeds keep up and one never reaches the level in 1.5x its window: the median says 1.0,
    the (geometric) mean counts the censored seed at its bound (a lower bound, so the interval is
    open above)."""
    c = [TargetCrossing(v, False, v) for v in (100.0, 98.0, 102.0)] + [TargetCrossing(None, True, 150.0)]
    med = estimate_over_seeds(c)
    est = estimate_over_seeds(c, statistic=GEOMETRIC_MEAN)
    assert med.samples_to_target == 101.0
    assert est.samples_to_target == pytest.approx((100 * 98 * 102 * 150) ** 0.25)
    assert est.samples_to_target > 110
    assert est.ci_low <= est.samples_to_target and math.isinf(est.ci_high)
    assert est.per_seed == med.per_seed and est.n_censored == 1
    clean = estimate_over_seeds(
        [TargetCrossing(v, False, v) for v in (90.0, 100.0, 140.0)], statistic=GEOMETRIC_MEAN
    )
    g = (90 * 100 * 140) ** (1 / 3)
    assert clean.samples_to_target == pytest.approx(g) and clean.ci_low < g < clean.ci_high < math.inf
    allc = estimate_over_seeds([TargetCrossing(None, True, 50.0)] * 2, statistic=GEOMETRIC_MEAN)
    assert math.isinf(allc.samples_to_target)
    mixed = [TargetCrossing(None, True, 80.0), TargetCrossing(60.0, False, 60.0)]
    one = estimate_over_seeds(mixed, statistic=GEOMETRIC_MEAN)
    assert one.samples_to_target == pytest.approx(math.sqrt(80 * 60))


def test_estimate_degenerate_inputs():
    with pytest.raises(AnalysisError):
        estimate_over_seeds([])
    with pytest.raises(AnalysisError):
        estimate_over_seeds([TargetCrossing(1.0, False, 2.0)], confidence=1.0)
    with pytest.raises(AnalysisError):
        TargetEstimate(5.0, 6.0, 7.0, 1, 0, (5.0,), (None,), 0.9)


def test_estimate_from_value():
    e = estimate_from_value(1200.0, (1000.0, 1500.0))
    assert (e.samples_to_target, e.ci_low, e.ci_high, e.n_seeds) == (1200.0, 1000.0, 1500.0, 1)
    assert estimate_from_value(10.0).ci_low == 10.0
    for bad in [(math.nan, None), (-1.0, None), (10.0, (11.0, 12.0))]:
        with pytest.raises(AnalysisError):
            estimate_from_value(*bad)


def test_ema_lag_is_corrected_so_spacing_does_not_bias_r():
    """Per-step logs are spaced by the batch: without the lag correction a batch of 128 would read
    ~128 samples late, a bias that grows with the batch and would fake a large-batch penalty."""
    for spacing in (8.0, 32.0, 128.0):
        s = np.arange(0.0, 2000.0 + spacing, spacing)
        crossing = samples_to_target(s, s / 1000.0, 0.5, ema_alpha=0.5, method="running_best")
        # uncorrected, the crossing reads one spacing late (26% at 128)
        assert crossing.samples_to_target == pytest.approx(500.0, rel=0.02)


def test_lag_correction_never_goes_before_the_raw_crossing():
    """A step-0 evaluation at samples 0: the corrected crossing stays where the raw data cross."""
    s = np.array([0.0, 64.0, 128.0, 192.0])
    crossing = samples_to_target(s, [0.1, 0.6, 0.7, 0.8], 0.3, ema_alpha=0.5, method="running_best")
    assert crossing.samples_to_target == pytest.approx(0.4 * 64.0)


def _stopped_estimate(s: np.ndarray, m: np.ndarray, target: float, margin: float) -> float:
    """R read where a probe stops: the first logged point at which the estimate is confirmed (the
    probe's own check, the same decision as target_confirmed(samples_to_target(...)), cheaper)."""
    for n in range(2, s.size + 1):
        c = confirmed_crossing(s[:n], m[:n], target, margin=margin)
        if c is not None and c.samples_to_target is not None:
            return c.samples_to_target
    r = samples_to_target(s, m, target).samples_to_target  # never confirmed: R of the whole curve
    assert r is not None
    return r


def test_stopping_at_the_first_confirmation_reads_early_and_the_shipped_margin_limits_it():
    """Optional stopping: on noisy curves, stopping as soon as the estimate is confirmed selects
    estimates that dipped early, and the more margin, the less. Same curves for both margins, so
    the difference is paired (docs/analysis-sample-efficiency.md; benchmarks/confirm_margin.py
    measures it with 2,000 curves: -2.5% at 0.20, -0.7% at the shipped 0.25)."""
    rng = np.random.default_rng(0)
    truth = 1000.0 * math.log(0.9 / 0.2)  # 0.9 (1 - exp(-s/1000)) = 0.7
    s = 32.0 * np.arange(1, 95)  # a point every 4 steps of 8 samples, to 2 R
    ratios: dict[float, list[float]] = {0.2: [], 0.25: []}
    for _ in range(150):
        m = 0.9 * _reward(s) + rng.normal(0, 0.15, s.size)
        for margin, out in ratios.items():
            out.append(_stopped_estimate(s, m, 0.7, margin) / truth)
    low, shipped = (np.array(ratios[k]) for k in (0.2, 0.25))
    # Paired, the later stop reads later on average (+0.6% to +2.7% over 18 seeds of this test) and
    # its median is the later one (18 of 18); one run scatters by about +-20%, so 150 curves pin a
    # median only to ~2.5% (one s.e.): the bound below is a sanity check, the 2% claim is the benchmark's.
    assert np.mean(shipped - low) > 0
    assert np.median(shipped) > np.median(low)
    assert abs(np.median(shipped) - 1) < 0.06


def test_a_crossing_at_the_last_knot_is_found_despite_the_interpolants_rounding():
    """A tiny-ppo control (branched probe, seeds 0-2): the isotonic fit's last block meets the level,
    but PCHIP evaluates that knot 1e-16 short of it; brentq then saw no sign change and the probe
    stopped with an internal error."""
    from batchtune.analysis.sample.monotone import monotone_crossing

    samples = np.array([0.0, 256.0, 512.0, 768.0, 1024.0, 1280.0])
    reward = np.array([0.865234375, 0.857421875, 0.880859375, 0.880859375, 0.88671875, 0.8828125])
    assert monotone_crossing(samples, reward, 0.884765625) == pytest.approx(1152.0)
    assert monotone_crossing(samples, reward, 0.8848) is None  # just past the fit: never reached
