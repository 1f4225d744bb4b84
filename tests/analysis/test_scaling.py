"""McCandlish R(B) fits: recovery on noiseless and noisy data, interval coverage, pinning, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchtune.analysis.sample.scaling import (
    fit_mccandlish,
    fit_steps_samples_line,
    mccandlish_samples,
    pollux_efficiency,
)
from batchtune.errors import AnalysisError

BATCHES = 64.0 * 2.0 ** np.arange(7)  # 64 .. 4096
E_MIN, B_CRIT = 1e5, 1024.0


def test_noiseless_recovery_is_exact():
    r = mccandlish_samples(BATCHES, E_MIN, B_CRIT)
    fit = fit_mccandlish(BATCHES, r)
    assert fit.e_min_samples == pytest.approx(E_MIN, rel=1e-9)
    assert fit.b_crit == pytest.approx(B_CRIT, rel=1e-9)
    assert fit.s_min_steps == pytest.approx(E_MIN / B_CRIT, rel=1e-9)
    assert fit.residual_rms_rel < 1e-9 and not fit.unbounded
    np.testing.assert_allclose(fit.predict_samples(BATCHES), r, rtol=1e-9)
    np.testing.assert_allclose(fit.predict_steps(BATCHES), r / BATCHES, rtol=1e-9)
    # R(B)/R(B0) = 1 + tol exactly at the crossing batch.
    cross = fit.crossing_batch(64.0, 0.1)
    assert cross == pytest.approx(64.0 * 1.1 + 0.1 * B_CRIT)
    ratio = fit.predict_samples(cross) / fit.predict_samples(64.0)
    assert ratio == pytest.approx(1.1)


def test_two_points_fit_exactly_but_without_interval():
    b = np.array([128.0, 1024.0])
    fit = fit_mccandlish(b, mccandlish_samples(b, E_MIN, B_CRIT))
    assert fit.b_crit == pytest.approx(B_CRIT)
    assert fit.b_crit_ci == (0.0, math.inf) and fit.cov is None
    lo, hi = fit.predict_interval(b)
    assert np.all(lo == 0) and np.all(np.isinf(hi))


def test_noisy_recovery_within_ten_percent_and_ci_covers():
    rng = np.random.default_rng(7)
    truth = mccandlish_samples(BATCHES, E_MIN, B_CRIT)
    covered, errs = 0, []
    trials = 100
    for t in range(trials):
        r = truth * np.exp(rng.normal(0.0, 0.03, BATCHES.size))
        fit = fit_mccandlish(BATCHES, r, seed=t)
        errs.append((fit.e_min_samples / E_MIN - 1, fit.b_crit / B_CRIT - 1))
        covered += fit.b_crit_ci[0] <= B_CRIT <= fit.b_crit_ci[1]
        lo, hi = fit.predict_interval(BATCHES, 0.9)
        assert np.all(lo <= fit.predict_samples(BATCHES)) and np.all(hi >= lo)
    med = np.median(np.abs(errs), axis=0)
    assert med[0] < 0.1 and med[1] < 0.1
    assert covered / trials >= 0.8  # nominal 0.9


def test_absolute_sigma_and_weights_agree():
    rng = np.random.default_rng(3)
    truth = mccandlish_samples(BATCHES, E_MIN, B_CRIT)
    r = truth * np.exp(rng.normal(0.0, 0.03, BATCHES.size))
    sigma = 0.03 * truth
    a = fit_mccandlish(BATCHES, r, sigma=sigma)
    b = fit_mccandlish(BATCHES, r, weights=1.0 / sigma**2)
    assert a.b_crit == pytest.approx(b.b_crit) and a.b_crit_ci == pytest.approx(b.b_crit_ci)
    assert a.ci_method.startswith("sigma")
    assert a.b_crit == pytest.approx(B_CRIT, rel=0.15)
    with pytest.raises(AnalysisError):
        fit_mccandlish(BATCHES, r, sigma=sigma, weights=1.0 / sigma**2)


def test_flat_data_is_unbounded_not_negative():
    rng = np.random.default_rng(4)
    r = E_MIN * np.exp(rng.normal(0.0, 0.02, BATCHES.size))
    r[-1] = 0.9 * E_MIN  # force a falling trend
    fit = fit_mccandlish(BATCHES, r)
    assert fit.unbounded and math.isinf(fit.b_crit) and fit.s_min_steps == 0.0
    assert fit.e_min_samples == pytest.approx(np.mean(r))
    assert math.isinf(fit.b_crit_ci[1]) and fit.b_crit_ci[0] >= 0
    assert math.isinf(fit.crossing_batch(64.0, 0.1))


def test_degenerate_inputs_raise():
    with pytest.raises(AnalysisError):
        fit_mccandlish([256.0], [1e5])
    with pytest.raises(AnalysisError):
        fit_mccandlish([256.0, 256.0], [1e5, 1.1e5])
    with pytest.raises(AnalysisError):
        fit_mccandlish([64.0, 128.0, 256.0], [1e5, math.nan, 1.2e5])
    with pytest.raises(AnalysisError):
        fit_mccandlish([64.0, 128.0], [1e5, math.inf])
    with pytest.raises(AnalysisError):  # R proportional to B: B_crit below the measured range
        fit_mccandlish(BATCHES, 50.0 * BATCHES - 10.0)


def test_steps_samples_line_recovers_the_same_model():
    r = mccandlish_samples(BATCHES, E_MIN, B_CRIT)
    fit = fit_steps_samples_line(r / BATCHES, r)
    assert fit.b_crit == pytest.approx(B_CRIT, rel=1e-9)
    assert fit.e_min_samples == pytest.approx(E_MIN, rel=1e-9)
    rng = np.random.default_rng(5)
    noisy = r * np.exp(rng.normal(0.0, 0.02, r.size))
    f2 = fit_steps_samples_line(noisy / BATCHES, noisy)
    assert f2.b_crit == pytest.approx(B_CRIT, rel=0.25)
    assert f2.b_crit_ci[0] <= f2.b_crit <= f2.b_crit_ci[1]
    with pytest.raises(AnalysisError):
        fit_steps_samples_line(E_MIN / BATCHES, np.full(BATCHES.size, E_MIN) * 1.0)


def test_pollux_efficiency_matches_mccandlish_ratio():
    eff = pollux_efficiency(BATCHES, B_CRIT, 64.0)
    r = mccandlish_samples(BATCHES, E_MIN, B_CRIT)
    np.testing.assert_allclose(eff, r[0] / r)
    assert eff[0] == 1.0 and np.all(np.diff(eff) < 0)
    np.testing.assert_array_equal(pollux_efficiency(BATCHES, math.inf, 64.0), 1.0)
    with pytest.raises(AnalysisError):
        pollux_efficiency(BATCHES, -1.0, 64.0)
