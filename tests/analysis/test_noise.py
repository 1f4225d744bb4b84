"""Noise scale and gradient-norm slope, recovered from synthetic gradients with known |G|^2, tr(S)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchtune.analysis.sample.noise import (
    b_simple_microbatches,
    b_simple_two_batch,
    grad_norm_slope,
    grad_norms_at_matched_samples,
)
from batchtune.errors import AnalysisError

DIM = 16


def _truth(g2: float, trace_s: float) -> tuple[np.ndarray, np.ndarray]:
    """True gradient G with |G|^2 = g2 and per-sample noise std per coordinate, tr(S) = trace_s."""
    g = np.full(DIM, math.sqrt(g2 / DIM))
    scale = np.linspace(0.5, 1.5, DIM)
    std = np.sqrt(trace_s * scale / scale.sum())
    return g, std


def _mean_grads(rng, g, std, batch: int, steps: int) -> np.ndarray:
    """Mean gradients of `batch` per-sample gradients, drawn sample by sample."""
    per_sample = g + std * rng.standard_normal((steps, batch, DIM))
    return per_sample.mean(axis=1)


def test_two_batch_recovers_b_simple():
    rng = np.random.default_rng(0)
    g, std = _truth(g2=1.0, trace_s=100.0)  # B_simple = 100
    small = _mean_grads(rng, g, std, 16, 2000)
    big = _mean_grads(rng, g, std, 256, 2000)
    ns = b_simple_two_batch(16, (small**2).sum(1), 256, (big**2).sum(1))
    assert ns.g2 == pytest.approx(1.0, rel=0.15)
    assert ns.trace_s == pytest.approx(100.0, rel=0.1)
    assert ns.b_simple == pytest.approx(100.0, rel=0.2)
    assert ns.n_pairs == 2000


def test_exact_expectations_give_exact_answer():
    g2, tr = 2.0, 500.0
    ns = b_simple_two_batch(32, g2 + tr / 32, 512, g2 + tr / 512)
    assert (ns.g2, ns.trace_s, ns.b_simple) == pytest.approx((g2, tr, tr / g2))


def test_microbatches_recover_b_simple():
    rng = np.random.default_rng(1)
    g, std = _truth(g2=1.0, trace_s=200.0)  # B_simple = 200
    k, micro, steps = 8, 32, 1500
    micro_grads = _mean_grads(rng, g, std, micro, steps * k).reshape(steps, k, DIM)
    full = micro_grads.mean(axis=1)  # the step's gradient is the mean of its micro-batches
    ns = b_simple_microbatches((micro_grads**2).sum(-1), (full**2).sum(-1), micro, k)
    assert ns.b_simple == pytest.approx(200.0, rel=0.2)
    one = b_simple_microbatches((micro_grads[0] ** 2).sum(-1), (full[0] ** 2).sum(), micro, k)
    assert one.n_pairs == 1


def test_noise_everywhere_gives_infinite_b_simple_not_a_crash():
    ns = b_simple_two_batch(16, 10.0, 64, 1.0)  # |G|^2 estimate (64 - 160)/48 < 0
    assert math.isinf(ns.b_simple) and ns.g2 < 0 and "noise dominates" in ns.reason
    flat = b_simple_two_batch(16, 1.0, 64, 1.2)  # norm grows with batch: no noise resolved
    assert flat.b_simple == 0.0 and "no gradient noise" in flat.reason


def test_noise_scale_degenerate_inputs():
    with pytest.raises(AnalysisError):
        b_simple_two_batch(64, 1.0, 16, 2.0)
    with pytest.raises(AnalysisError):
        b_simple_two_batch(16, [1.0, math.nan], 64, [1.0, 1.0])
    with pytest.raises(AnalysisError):
        b_simple_two_batch(16, [1.0, 2.0], 64, [1.0])
    with pytest.raises(AnalysisError):
        b_simple_two_batch(16, 0.0, 64, 0.0)
    with pytest.raises(AnalysisError):
        b_simple_microbatches(np.ones((3, 4)), np.ones(3), 8, 8)


def _norms(rng, batches, g2, trace_s, steps=200) -> np.ndarray:
    g, std = _truth(g2, trace_s)
    out = []
    for b in batches:
        mean = g + std / math.sqrt(b) * rng.standard_normal((steps, DIM))  # exact law of the mean
        out.append(np.sqrt((mean**2).sum(1)).mean())
    return np.array(out)


def test_slope_is_minus_half_when_noise_dominates_and_flat_otherwise():
    rng = np.random.default_rng(2)
    batches = 64.0 * 2.0 ** np.arange(6)
    noisy = grad_norm_slope(batches, _norms(rng, batches, g2=1.0, trace_s=1e6))
    assert noisy.slope == pytest.approx(-0.5, abs=0.05) and noisy.noise_dominated
    assert -0.55 < noisy.slope_ci[0] <= noisy.slope_ci[1] < -0.45
    clean = grad_norm_slope(batches, _norms(rng, batches, g2=1.0, trace_s=1.0))
    assert clean.slope == pytest.approx(0.0, abs=0.05) and not clean.noise_dominated
    assert "flat" in clean.reason
    assert clean.n_points == 6


def test_slope_with_two_batches_decides_on_the_point():
    two = grad_norm_slope([64.0, 256.0], [1.0, 0.5])
    assert two.slope == pytest.approx(-0.5) and two.noise_dominated
    assert two.slope_ci == (-math.inf, math.inf) and "no interval" in two.reason
    with pytest.raises(AnalysisError):
        grad_norm_slope([64.0, 64.0], [1.0, 0.9])
    with pytest.raises(AnalysisError):
        grad_norm_slope([64.0, 128.0], [1.0, 0.0])


def test_matched_samples_interpolation():
    runs = [
        (64.0, np.arange(0, 6400, 64.0), np.full(100, 2.0)),
        (256.0, np.arange(0, 25600, 256.0), np.linspace(1.0, 0.0, 100) + 1.0),
    ]
    b, g = grad_norms_at_matched_samples(runs, 3200.0, ema_alpha=1.0)
    np.testing.assert_array_equal(b, [64.0, 256.0])
    assert g[0] == 2.0 and g[1] == pytest.approx(2.0 - 3200.0 / 256.0 / 99.0)
    with pytest.raises(AnalysisError):
        grad_norms_at_matched_samples(runs, 10_000.0)
    with pytest.raises(AnalysisError):
        grad_norms_at_matched_samples([], 1.0)
