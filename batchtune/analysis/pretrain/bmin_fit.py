"""B_min from Zhou et al.'s three-stage E(S) fitted across the reached batches (docs/method.md §6).

The stable-phase E(S) = b / (S - S_min) + A1 S + A0 has B_min = A1 (its late slope). With E = B S
a batch's steps to the target satisfy

    B(S) = A1 + A0 / S + b / (S (S - S_min))

which for a fixed S_min is linear in (A1, A0, b); S_min in [0, min S) is profiled (a log grid of
the gap to the smallest measured S, then a bounded scalar search). The errors are in S (B is
set), so the residuals in B are weighted by the model's dB/dS (iteratively: once from the
unweighted fit, twice more), which makes them relative errors in S. On exact three-stage data it
is exact (B_min to 1e-6 on a doubling grid: tests/analysis/test_pretrain_bmin.py); on the
SynthLaw curves it is within 2-10% (benchmarks/out/pretrain_refine_recovery.txt). The line
``1/S = (B - A1)/A0`` it replaces holds only once b / (S (S - S_min)) is negligible, which on a
doubling grid it never is at the reached batches nearest B_min: it was rejected even on exact data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar

MIN_POINTS = 5  # four parameters and one degree of freedom for the residual check


@dataclass(frozen=True)
class ThreeStageFit:
    a1: float  # B_min, tokens
    a0: float
    b: float
    s_min: float
    resid: float  # rms relative residual in S at the fitted points
    n_points: int


def _solve(b: np.ndarray, s: np.ndarray, s_min: float, w: np.ndarray) -> tuple[float, np.ndarray]:
    x = np.column_stack([np.ones_like(s), 1.0 / s, 1.0 / (s * (s - s_min))])
    coef, *_ = np.linalg.lstsq(x * w[:, None], b * w, rcond=None)
    return float(np.sqrt(np.mean(((x @ coef - b) * w) ** 2))), coef


def _profile(b: np.ndarray, s: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
    """(S_min, coefficients) minimising the weighted residual."""
    m = float(s.min())
    gaps = np.geomspace(m * 1e-6, m, 80)
    rs = [_solve(b, s, m - g, w)[0] for g in gaps]
    j = int(np.argmin(rs))
    lo, hi = math.log(gaps[max(j - 1, 0)]), math.log(gaps[min(j + 1, gaps.size - 1)])
    opt = minimize_scalar(
        lambda lg: _solve(b, s, m - math.exp(lg), w)[0],
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-10},
    )
    s_min = m - math.exp(float(opt.x)) if float(opt.fun) < rs[j] else m - float(gaps[j])
    return s_min, _solve(b, s, s_min, w)[1]


def fit_three_stage(batches: np.ndarray, steps: np.ndarray) -> ThreeStageFit | None:
    """The fit on the reached batches (finite ``steps``); None with fewer than MIN_POINTS."""
    ok = np.isfinite(steps) & (steps > 0)
    b, s = np.asarray(batches, float)[ok], np.asarray(steps, float)[ok]
    if b.size < MIN_POINTS:
        return None
    w = 1.0 / b  # start: relative residuals in B
    for _ in range(3):
        s_min, (a1, a0, bb) = _profile(b, s, w)
        slope = np.abs(-a0 / s**2 - bb * (2 * s - s_min) / (s**2 * (s - s_min) ** 2))  # |dB/dS|
        w = 1.0 / np.maximum(slope * s, 1e-12 * b)  # B residual / (|dB/dS| S) = relative S residual
    pred = a1 + a0 / s + bb / (s * (s - s_min))
    resid = float(np.sqrt(np.mean(((pred - b) * w) ** 2)))
    return ThreeStageFit(float(a1), float(a0), float(bb), float(s_min), resid, int(b.size))
