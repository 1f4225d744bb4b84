"""Fits against progress for a branched probe (pure numpy/scipy): the local critical batch against
samples consumed (`fit_progress`, Merrill et al. 2025 find it ~0 at init, growing, then plateauing),
and the reference batch's curve extrapolated to the final target (`extrapolate_to_target`, R(B0)
when the trunk stopped short; its recovery study is benchmarks/recovery_extrapolation.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from batchtune.analysis.sample.curves import samples_to_target
from batchtune.errors import AnalysisError


@dataclass(frozen=True)
class ProgressFit:
    """log B_crit = a + b log(samples): the local critical batch against samples consumed.

    Weighted least squares on the checkpoints whose crossing is finite, each weighted by the
    inverse square of its interval's half-width in log space; `predict` gives the point and a t
    interval (the fit's parameter uncertainty and the scatter of the points about it, as a
    prediction interval). A trend in log-log space is the simplest one that starts near zero and
    grows (Merrill et al. 2025 find the critical batch ~0 at init, growing, then plateauing;
    Kaplan et al. 2020's B_crit(L) is a power law in the loss). With two points the slope has no
    residual to judge it by: the interval then uses the points' own interval widths (z, not t).
    """

    intercept: float
    slope: float
    cov: np.ndarray  # 2x2 covariance of (intercept, slope)
    sigma: float  # scatter about the line in log B_crit (1.0 when only the points' intervals count)
    dof: int
    n_points: int
    confidence: float

    def predict(self, samples: float) -> tuple[float, float, float]:
        """(B_crit, low, high) at ``samples`` consumed."""
        x = math.log(samples)
        mean = self.intercept + self.slope * x
        var = float(np.array([1.0, x]) @ self.cov @ np.array([1.0, x])) + (
            self.sigma**2 if self.dof > 0 else 0
        )
        q = (1 + self.confidence) / 2
        crit = float(stats.t.ppf(q, self.dof)) if self.dof > 0 else float(stats.norm.ppf(q))
        half = crit * math.sqrt(max(var, 0.0))
        return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def fit_progress(
    samples: Sequence[float],
    b_crit: Sequence[float],
    intervals: Sequence[tuple[float, float]],
    *,
    confidence: float = 0.9,
) -> ProgressFit:
    """Fit log B_crit against log samples (ProgressFit). Needs >= 2 finite checkpoints."""
    x, y, w = [], [], []
    z = float(stats.norm.ppf((1 + confidence) / 2))
    for s, b, (lo, hi) in zip(samples, b_crit, intervals, strict=True):
        if not (s > 0 and math.isfinite(b) and b > 0):
            continue
        lo_ = lo if lo > 0 and math.isfinite(lo) else b / 2
        hi_ = hi if math.isfinite(hi) else b * 2
        half = max((math.log(hi_) - math.log(lo_)) / 2 / z, 0.02)
        x.append(math.log(s))
        y.append(math.log(b))
        w.append(1.0 / half**2)
    if len(x) < 2 or len(set(x)) < 2:
        raise AnalysisError(
            f"the critical batch against progress needs >= 2 checkpoints with a finite local critical "
            f"batch, got {len(x)}; add checkpoints or raise the largest candidate batch"
        )
    X = np.column_stack([np.ones(len(x)), x])
    W = np.diag(w)
    cov_unit = np.linalg.inv(X.T @ W @ X)
    beta = cov_unit @ X.T @ W @ np.asarray(y)
    dof = len(x) - 2
    if dof > 0:
        resid = np.asarray(y) - X @ beta
        s2 = float(resid @ W @ resid) / dof  # in units of the points' own variances
        scale = max(s2, 1.0)
        cov = cov_unit * scale
        sigma = math.sqrt(scale / float(np.mean(w)))
    else:
        cov, sigma = cov_unit, 0.0
    return ProgressFit(float(beta[0]), float(beta[1]), cov, sigma, dof, len(x), confidence)


def _exp(x: float) -> float:
    return math.exp(x) if x < 700.0 else math.inf


def _reach(xs: np.ndarray, ys: np.ndarray, target: float, sign: float, q: float) -> tuple[float, float]:
    """Where the line fitted to (xs, ys) reaches ``target`` (in x), and the latest its slope's
    t interval allows (inf when that slope does not move towards the target)."""
    res = stats.linregress(xs, ys)
    end = res.intercept + res.slope * xs[-1]

    def at(slope: float) -> float:
        return math.inf if sign * slope <= 0 else float(xs[-1] + (target - end) / slope)

    return at(res.slope), max(at(res.slope), at(res.slope - sign * q * res.stderr))


def extrapolate_to_target(
    samples: np.ndarray, values: np.ndarray, target: float, *, higher_is_better: bool, confidence: float = 0.9
) -> tuple[float, float, float]:
    """Samples at which a curve that stopped short would reach ``target``: (point, low, high).

    Point: the metric fitted as a line in log(samples) over the last half of the curve (the slow,
    logarithmic-looking late phase of a loss curve; a stated assumption, not a law). inf when the
    trend does not move towards the target. Interval: what the curve itself allows. The low end is
    where the curve stops (it has not reached the target by then; a curve can still speed up, as
    RL reward curves do), the high end the latest of three forms, each at its slope's t bound:
    metric linear in log(samples), linear in samples, and a power law (log metric linear in log
    samples; positive metrics only). One curve's t interval, taken alone, covered the truth in 0-10%
    of NQM trunks and 0-33% of the tiny RL runs' (a curve's shape past its end is not in its own
    noise); this envelope covered all of them, and its point ran 0.91-1.11x the truth (median) on NQM
    loss curves but 1.6-64x high on RL reward curves cut at 2-4k samples, which creep and then climb
    (benchmarks/recovery_extrapolation.py, docs/branched.md). If the curve already reached the
    target, its crossing (an interval of zero width).
    """
    s, v = np.asarray(samples, dtype=float), np.asarray(values, dtype=float)
    hit = samples_to_target(s, v, target, higher_is_better=higher_is_better)
    if not hit.censored and hit.samples_to_target is not None:
        return (hit.samples_to_target,) * 3
    keep = s >= s[-1] / 2
    if int(np.count_nonzero(keep)) < 4:
        raise AnalysisError("extrapolating to the target needs >= 4 points in the last half of the trunk")
    xs, ys = s[keep], v[keep]
    sign = 1.0 if higher_is_better else -1.0
    q = float(stats.t.ppf((1 + confidence) / 2, xs.size - 2))
    log_point, log_high = (_exp(x) for x in _reach(np.log(xs), ys, target, sign, q))
    highs = [log_high, _reach(xs, ys, target, sign, q)[1]]
    if target > 0 and bool(np.all(ys > 0)):
        highs.append(_exp(_reach(np.log(xs), np.log(ys), math.log(target), sign, q)[1]))
    return log_point, min(float(s[-1]), log_point), max(*highs, log_point)
