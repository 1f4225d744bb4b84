"""A monotone curve fitted to a noisy learning curve, and where it crosses a target.

The estimator behind `curves.samples_to_target` (docs/method.md §8, "samples-to-target is an estimate, not
a first crossing"):
  1. isotonic regression of the metric on samples (pool-adjacent-violators, Ayer et al. 1955;
     Barlow et al. 1972, "Statistical Inference under Order Restrictions"): the least-squares
     non-decreasing fit, min sum_i (m_i - f_i)^2 s.t. f_1 <= ... <= f_n;
  2. one knot per fitted block at (mean samples, mean metric) of its points;
  3. a monotone cubic (PCHIP, Fritsch & Carlson 1980) through the knots, solved for f(R) = target.
Unlike the first crossing of a running best, noise cannot make the fit cross early: a block
pools points until their means are ordered, so a single lucky point lifts a block by
sigma / sqrt(points in it) only. The recovery study (benchmarks/recovery_samples_to_target.py)
measures the residual bias per batch and logging interval.

The noise level is estimated from the data as the robust spread of consecutive differences,
sigma = 1.4826 * MAD(diff(m)) / sqrt(2) (a trend adds only its slope times the spacing).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.interpolate import PchipInterpolator
from scipy.optimize import brentq, isotonic_regression

from batchtune.errors import AnalysisError

_MAD_TO_SD = 1.4826


def isotonic_increasing(y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted least-squares non-decreasing fit of `y` (pool-adjacent-violators, O(n)).

    scipy's compiled PAVA (`scipy.optimize.isotonic_regression`): a probe refits each run's curve
    at every logged point, so on a run of a thousand points the fit is most of the probe's time.
    """
    y = np.asarray(y, dtype=float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
    if y.ndim != 1 or w.shape != y.shape or np.any(w <= 0) or not np.all(np.isfinite(y)):
        raise AnalysisError("isotonic regression needs finite 1-D values and positive weights")
    return np.asarray(isotonic_regression(y, weights=w, increasing=True).x, dtype=float)


def noise_sd(metric: np.ndarray) -> float:
    """Per-point noise from consecutive differences: 1.4826 * MAD(diff) / sqrt(2); 0 below 3 points."""
    m = np.asarray(metric, dtype=float)
    if m.size < 3:
        return 0.0
    d = np.diff(m)
    return float(_MAD_TO_SD * np.median(np.abs(d - np.median(d))) / math.sqrt(2.0))


def block_knots(samples: np.ndarray, fitted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Knots of an isotonic fit: per block (mean samples, block value, first samples of the block)."""
    starts = np.r_[0, np.flatnonzero(np.diff(fitted) != 0) + 1]
    counts = np.diff(np.r_[starts, fitted.size])
    centres = np.add.reduceat(samples, starts) / counts
    return centres, fitted[starts], samples[starts]


def _crossing_knots(
    samples: np.ndarray, metric: np.ndarray, target: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """The isotonic fit's knots (`block_knots`) and the first knot meeting `target`; None if none does.
    Points that share a samples value are averaged first, so the knots are strictly increasing."""
    s = np.asarray(samples, dtype=float)
    m = np.asarray(metric, dtype=float)
    if np.all(s[1:] > s[:-1]):  # no shared samples (a probe's own runs): nothing to average
        xs, ys, weights = s, m + 0.0, np.ones_like(s)  # + 0.0: -0.0 reads 0.0, as the sums below do
    else:
        xs, inv, cnt = np.unique(s, return_inverse=True, return_counts=True)
        ys, weights = np.bincount(inv, weights=m) / cnt, cnt.astype(float)
    fitted = isotonic_increasing(ys, weights)
    if fitted[-1] < target:
        return None
    centres, values, firsts = block_knots(xs, fitted)
    return centres, values, firsts, int(np.argmax(values >= target))


def crossing_floor(samples: np.ndarray, metric: np.ndarray, target: float) -> float | None:
    """A lower bound on `monotone_crossing` from the isotonic fit alone, without the cubic.

    None exactly when `monotone_crossing` is None. Otherwise the crossing lies between the knot
    before the first knot that meets the target and that knot (PCHIP is monotone between knots
    and the root is bracketed there), so that earlier knot's samples bound it from below; when
    the first knot meets the target, the bound is the crossing itself (the first samples).
    """
    knots = _crossing_knots(samples, metric, target)
    if knots is None:
        return None
    centres, _, firsts, k = knots
    return float(firsts[0]) if k == 0 else float(centres[k - 1])


def monotone_crossing(samples: np.ndarray, metric: np.ndarray, target: float) -> float | None:
    """Samples where the monotone (isotonic + PCHIP) fit of an increasing metric reaches `target`.

    `samples` sorted ascending, `metric` finite, higher is better (negate both metric and target
    for a loss). None when the fit never reaches the target (censored). When the first block
    already meets it, the first logged samples (the crossing happened before the first point).
    Points that share a samples value are averaged first, so the knots are strictly increasing.
    """
    knots = _crossing_knots(samples, metric, target)
    if knots is None:
        return None
    centres, values, firsts, k = knots
    if k == 0:
        return float(firsts[0])
    if centres.size == 2:
        x0, x1, v0, v1 = centres[0], centres[1], values[0], values[1]
        return float(x0 + (target - v0) / (v1 - v0) * (x1 - x0))
    curve = PchipInterpolator(centres, values, extrapolate=False)

    def gap(x: float) -> float:
        return float(curve(x)) - target

    # the interpolant at a knot can miss the knot's value by a rounding error (PCHIP evaluates the
    # last knot from the interval before it): a knot that meets the target then reads as just short
    if gap(centres[k]) <= 0:
        return float(centres[k])
    root = brentq(gap, centres[k - 1], centres[k], xtol=1e-12 * centres[k])
    if not math.isfinite(root):
        raise AnalysisError(
            f"the monotone fit gave a non-finite crossing between {centres[k - 1]} and {centres[k]}"
        )
    return float(root)
