"""Gradient norm against batch and the gradient noise scale (docs/method.md §3.3).

For the mean gradient of B independent samples (McCandlish et al. 2018, appendix A.1):
    E|g_B|^2 = |G|^2 + tr(S) / B,        B_simple = tr(S) / |G|^2,
S the per-sample gradient covariance. Below B_simple the noise term dominates and |g_B| ~ B^-1/2
(0.707x per doubling); when the pre-clip norm stops falling with B, the invariant range has ended.

Caution (Merrill et al. 2025, "Critical Batch Size Revisited"): for Adam-trained LMs B_simple has
underestimated the directly measured critical batch by orders of magnitude. It is a trend signal
and a cheap prior for where to probe, never the answer. In GRPO the responses of one prompt are
correlated: callers must split micro-batches by whole groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from batchtune.analysis.sample.curves import clean_curve, ema
from batchtune.errors import AnalysisError

__all__ = [
    "GradNormSlope",
    "NoiseScale",
    "b_simple_microbatches",
    "b_simple_two_batch",
    "ema",
    "grad_norm_slope",
    "grad_norms_at_matched_samples",
]

NOISE_SLOPE = -0.5  # |g_B| ~ B^-1/2 when the noise term dominates
STEEP_SLOPE = -0.35  # a CI wholly below this is decisively falling
FLAT_SLOPE = -0.1  # a CI reaching above this is described as flat (reason text only)


@dataclass(frozen=True)
class GradNormSlope:
    """OLS slope of log|g| on log B, with a t interval (needs >= 3 batches; 2 give (-inf, inf)).

    noise_dominated rule (we choose): the interval lies below 0 (excludes a flat norm) AND either
    contains -0.5 or lies wholly below -0.35. With two batches there is no interval and the point
    decides: slope < -0.35. A slope near 0 means |G|^2 dominates: the invariant range has ended.
    """

    slope: float
    slope_ci: tuple[float, float]
    n_points: int
    noise_dominated: bool
    reason: str


def grad_norm_slope(batches: ArrayLike, grad_norms: ArrayLike, *, confidence: float = 0.9) -> GradNormSlope:
    """Fit log|g| = c + slope * log B; expect -0.5 while noise dominates, ~0 once it does not.

    Norms must be pre-clip and taken at matched samples consumed (see
    `grad_norms_at_matched_samples`), with each batch at its scaled LR.
    """
    if not 0.0 < confidence < 1.0:
        raise AnalysisError(f"confidence must lie in (0, 1), got {confidence}")
    b = np.asarray(batches, dtype=float)
    g = np.asarray(grad_norms, dtype=float)
    if b.ndim != 1 or b.shape != g.shape:
        raise AnalysisError(
            f"batches and grad_norms must be 1-D of equal length, got {b.shape} and {g.shape}"
        )
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(g))) or np.any(b <= 0) or np.any(g <= 0):
        raise AnalysisError(
            "batches and gradient norms must be finite and > 0; log the pre-clip norm and drop diverged steps"
        )
    if np.unique(b).size < 2:
        raise AnalysisError(f"a slope needs at least two distinct batches, got {np.unique(b).tolist()}")
    res = stats.linregress(np.log(b), np.log(g))
    slope = float(res.slope)
    n = b.size
    if n > 2 and math.isfinite(res.stderr):
        half = float(stats.t.ppf((1 + confidence) / 2, n - 2)) * float(res.stderr)
        lo, hi = slope - half, slope + half
        noise = hi < 0 and ((lo <= NOISE_SLOPE <= hi) or hi < STEEP_SLOPE)
        shown = f"slope {slope:.2f} [{lo:.2f}, {hi:.2f}]"
        if noise:
            why = f"{shown}: falls like B^-1/2, noise dominates"
        elif hi >= FLAT_SLOPE:
            why = f"{shown}: close to flat, |G|^2 dominates (the invariant range has ended)"
        else:
            why = f"{shown}: neither B^-1/2 nor flat, the noise term is fading"
    else:
        lo, hi = -math.inf, math.inf
        noise = slope < STEEP_SLOPE
        side = "below" if noise else "above"
        why = f"slope {slope:.2f} {side} {STEEP_SLOPE} (two batches: no interval, point decides)"
    return GradNormSlope(slope, (lo, hi), int(n), bool(noise), why)


def grad_norms_at_matched_samples(
    runs: Sequence[tuple[float, ArrayLike, ArrayLike]],
    at_samples: float,
    *,
    ema_alpha: float = 0.5,
) -> tuple[np.ndarray, np.ndarray]:
    """Each run's EMA-smoothed pre-clip gradient norm, linearly interpolated at `at_samples`.

    `runs`: (batch, samples consumed per step, grad norm per step). Returns (batches, norms) in
    the order given. The EMA runs over steps, so it lags by about (1 - alpha)/alpha steps, i.e.
    more samples at larger batch; pass ema_alpha=1 to disable it when the norms are smooth.
    `at_samples` outside a run's logged range raises: no extrapolation.
    """
    if not runs:
        raise AnalysisError("no runs given: pass (batch, samples, grad_norms) for each batch")
    batches, norms = [], []
    for batch, samples, grad_norms in runs:
        s, g = clean_curve(samples, grad_norms)
        if not s[0] <= at_samples <= s[-1]:
            raise AnalysisError(
                f"the run at batch {batch:g} logged samples {s[0]:g}..{s[-1]:g}, which does not "
                f"cover {at_samples:g}; choose at_samples inside every run's range"
            )
        batches.append(float(batch))
        norms.append(float(np.interp(at_samples, s, ema(g, ema_alpha))))
    return np.array(batches), np.array(norms)


@dataclass(frozen=True)
class NoiseScale:
    """Two-batch estimate of the simple noise scale B_simple = tr(S) / |G|^2 (batch units).

    `g2`: |G|^2, the squared norm of the true gradient; `trace_s`: tr(S), summed per-sample
    gradient variance (squared-norm units times batch units). `b_simple` is inf when the |G|^2
    estimate is <= 0 (noise dominates everything measured) and 0 when the tr(S) estimate is <= 0
    (no noise resolved); `reason` says which. A prior for where to probe, never the answer.
    """

    b_simple: float
    g2: float
    trace_s: float
    n_pairs: int
    reason: str


def b_simple_two_batch(b_small: float, g2_small: ArrayLike, b_big: float, g2_big: ArrayLike) -> NoiseScale:
    """Unbiased two-batch estimator at the same parameters (McCandlish et al. 2018, A.1):

        |G|^2 ~ (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
        tr(S) ~ (|g_small|^2 - |g_big|^2) / (1/B_small - 1/B_big)

    `g2_small`, `g2_big`: squared norms, scalars or arrays over steps (paired, same length). Each
    is averaged over steps first, so numerator and denominator are averaged separately before
    the division B_simple = tr(S) / |G|^2 (the ratio of means, not a mean of noisy ratios).
    """
    gs = np.atleast_1d(np.asarray(g2_small, dtype=float))
    gb = np.atleast_1d(np.asarray(g2_big, dtype=float))
    if gs.ndim != 1 or gs.shape != gb.shape or gs.size == 0:
        raise AnalysisError(
            f"g2_small and g2_big must be paired (same length), got {gs.shape} and {gb.shape}"
        )
    if not (np.all(np.isfinite(gs)) and np.all(np.isfinite(gb))) or np.any(gs < 0) or np.any(gb < 0):
        raise AnalysisError("squared gradient norms must be finite and >= 0; drop diverged steps")
    if not (math.isfinite(b_small) and math.isfinite(b_big) and 0 < b_small < b_big):
        raise AnalysisError(f"need 0 < b_small < b_big (finite), got b_small={b_small}, b_big={b_big}")
    ms, mb = float(gs.mean()), float(gb.mean())
    g2 = (b_big * mb - b_small * ms) / (b_big - b_small)
    trace_s = (ms - mb) / (1.0 / b_small - 1.0 / b_big)
    if g2 <= 0 and trace_s <= 0:
        raise AnalysisError("all squared gradient norms are zero: check that gradients were logged")
    if g2 <= 0:
        return NoiseScale(
            math.inf, g2, trace_s, gs.size, "|G|^2 estimate <= 0: noise dominates every batch used"
        )
    if trace_s <= 0:
        return NoiseScale(0.0, g2, trace_s, gs.size, "tr(S) estimate <= 0: no gradient noise resolved")
    return NoiseScale(trace_s / g2, g2, trace_s, gs.size, "tr(S) / |G|^2 from two batch sizes")


def b_simple_microbatches(micro_g2: ArrayLike, full_g2: ArrayLike, micro_batch: float, k: int) -> NoiseScale:
    """B_simple from the K micro-batches of each step: small batch = one micro-batch, big = all.

    `micro_g2`: squared norms of each micro-batch's mean gradient, shape (K,) or (steps, K);
    `full_g2`: squared norm of the step's gradient (the mean of the K micro-batch gradients),
    scalar or (steps,). |g_small|^2 is the mean over the K micro-batches; B_small = micro_batch,
    B_big = k * micro_batch. Micro-batches must be equal-sized with mean-reduced losses (so the
    step gradient is their mean) and, in GRPO, hold whole groups.
    """
    if int(k) != k or k < 2:
        raise AnalysisError(f"k must be an integer >= 2 micro-batches per step, got {k}")
    m = np.asarray(micro_g2, dtype=float)
    m = m[None, :] if m.ndim == 1 else m
    if m.ndim != 2 or m.shape[1] != k:
        raise AnalysisError(
            f"micro_g2 must have shape (K,) or (steps, K) with K={k}, got {np.shape(micro_g2)}"
        )
    full = np.atleast_1d(np.asarray(full_g2, dtype=float))
    if full.shape != (m.shape[0],):
        raise AnalysisError(f"full_g2 needs one value per step ({m.shape[0]}), got shape {np.shape(full_g2)}")
    return b_simple_two_batch(micro_batch, m.mean(axis=1), k * micro_batch, full)
