"""Branched-probe analysis: local ratios on curves of known slowdown, the progress fit and the
trunk extrapolation recover what generated them (seeded)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchtune.analysis.branched import (
    BranchCurve,
    extrapolate_to_target,
    fit_progress,
    local_critical_batch,
)
from batchtune.errors import AnalysisError


def _branch(batch: float, seed: int, slowdown: float, rng: np.random.Generator) -> BranchCurve:
    """A loss falling linearly from 2.0 at 1/slowdown the control's rate, logged every batch."""
    s = np.arange(batch, 2.5 * 1024 + batch, batch)
    v = 2.0 - 1e-3 * s / slowdown + rng.normal(0, 1e-4, s.size)
    return BranchCurve(batch=batch, seed=seed, samples=s, values=v, consumed=float(s[-1]))


def test_local_critical_batch_reads_known_slowdowns() -> None:
    rng = np.random.default_rng(0)
    slow = {8: 1.0, 32: 1.0, 128: 1.03, 512: 1.5}
    curves = [
        _branch(b, s, k * (1 + 0.01 * s), rng) if b != 8 else _branch(b, s, 1 + 0.01 * s, rng)
        for b, k in slow.items()
        for s in range(3)
    ]
    lc = local_critical_batch(
        4096, 2.0, curves, reference_batch=8, window_samples=1024, higher_is_better=False, tol=0.1
    )
    assert lc.level == pytest.approx(2.0 - 1e-3 * 1024 / 1.01, abs=2e-3)
    for b, k in slow.items():
        assert np.median(list(lc.ratios[b].values())) == pytest.approx(k, rel=0.03)
    lo, hi = lc.interval
    assert 128 <= lc.point <= 512 and lo <= lc.point <= hi


def test_a_plateau_after_the_checkpoint_is_a_clear_error_not_a_zero_ratio() -> None:
    """Controls that end the window no better than the checkpoint: every branch would 'reach' the
    local target at 0 samples; say why instead of dividing 0 by 0."""
    s = np.arange(8.0, 2048.0, 8.0)
    flat = [
        BranchCurve(batch=8, seed=k, samples=s, values=np.full(s.size, 1.5), consumed=2048.0)
        for k in range(2)
    ]
    with pytest.raises(AnalysisError, match="no progress in the window after the checkpoint at 4096"):
        local_critical_batch(4096, 1.5, flat, reference_batch=8, window_samples=1024, higher_is_better=False)


def test_fit_progress_recovers_a_power_trend() -> None:
    samples = np.array([1e3, 3e3, 1e4, 3e4])
    b = 50 * (samples / 1e3) ** 0.5
    fit = fit_progress(samples, b, [(x / 1.2, x * 1.2) for x in b])
    assert fit.slope == pytest.approx(0.5, abs=1e-6)
    p, lo, hi = fit.predict(1e5)
    assert p == pytest.approx(50 * 100**0.5, rel=1e-6) and lo < p < hi
    with pytest.raises(AnalysisError):
        fit_progress([1e3], [10.0], [(5.0, 20.0)])


def test_extrapolate_to_target_on_a_log_linear_curve() -> None:
    rng = np.random.default_rng(1)
    s = np.arange(64, 4096 + 1, 64, dtype=float)
    v = 3.0 - 0.5 * np.log(s / 64) + rng.normal(0, 0.01, s.size)
    true = 64 * math.exp((3.0 - 0.5) / 0.5)  # where 3 - 0.5 log(s/64) = 0.5
    p, lo, hi = extrapolate_to_target(s, v, 0.5, higher_is_better=False)
    assert lo <= true <= hi and p == pytest.approx(true, rel=0.1)
    r, r_lo, r_hi = extrapolate_to_target(s, v, 1.0, higher_is_better=False)  # reached: measured
    assert r == r_lo == r_hi and r < s[-1]
