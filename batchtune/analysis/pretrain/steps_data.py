"""Pre-training batch size: the steps-data trade-off, WSD's E(S), and batch schedules (docs/method.md §6).

Units: batch and data ``E`` in tokens, ``S`` in optimiser steps, ``E = B * S``. Every point
``(S_i, E_i)`` is one batch size reaching the *same* target loss.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.optimize import least_squares, minimize_scalar

from batchtune.analysis.pretrain.schedule import positive_finite as _positive_finite
from batchtune.errors import AnalysisError


def _points(steps: object, data: object) -> tuple[np.ndarray, np.ndarray]:
    """Paired (S, E) points sorted by S."""
    s, e = _positive_finite("steps", steps), _positive_finite("data", data)
    if s.shape != e.shape:
        raise AnalysisError(f"steps has {s.size} values but data has {e.size}.")
    order = np.argsort(s, kind="stable")
    return s[order], e[order]


# --- Constant LR: the McCandlish hyperbola --------------------------------------------------------


@dataclass(frozen=True)
class StepsDataFit:
    """McCandlish et al. 2018 (arXiv 1812.06162, §2.3): ``(S/S_min - 1)(E/E_min - 1) = 1``.

    Equivalently ``S(B) = S_min (1 + B_crit/B)`` and ``E(B) = E_min (1 + B/B_crit)`` with
    ``B_crit = E_min / S_min``. CIs are two-sided at ``confidence``, from the fit's covariance on
    the log scale (so they are positive and asymmetric).
    """

    s_min_steps: float
    e_min_tokens: float
    b_crit_tokens: float
    s_min_ci: tuple[float, float]
    e_min_ci: tuple[float, float]
    b_crit_ci: tuple[float, float]
    n_points: int
    residual_rms_log: float
    confidence: float

    def predict_steps(self, batch_tokens: object) -> np.ndarray:
        return self.s_min_steps * (1.0 + self.b_crit_tokens / np.asarray(batch_tokens, float))

    def predict_tokens(self, batch_tokens: object) -> np.ndarray:
        return self.e_min_tokens * (1.0 + np.asarray(batch_tokens, float) / self.b_crit_tokens)


def fit_steps_data(steps: object, data: object, *, confidence: float = 0.95) -> StepsDataFit:
    """Fit the hyperbola to points ``(S_i, E_i)`` that reach the same loss at different batches.

    The batch of each point is ``B_i = E_i / S_i`` (exact: it was chosen). We fit
    ``log S_i = log S_min + log(1 + B_crit / B_i)`` by nonlinear least squares in
    ``(log S_min, log B_crit)``; residuals in ``log S`` equal those in ``log E``, so steps and data
    are treated alike. The start comes from the straight line ``1/S = 1/S_min - B_crit / E``
    (docs/method.md §3.4). Needs >= 3 points (2 parameters plus one degree of freedom for the CI).
    """
    s, e = _points(steps, data)
    b = e / s
    if np.unique(b).size < 3:
        raise AnalysisError(
            f"need >= 3 (steps, data) points at different batches for the steps-data fit, got "
            f"batches {sorted(set(b.tolist()))}; run more batch sizes to the same target loss."
        )
    if not 0.0 < confidence < 1.0:
        raise AnalysisError(f"confidence must be in (0, 1), got {confidence}.")
    inv_e = 1.0 / e
    slope, intercept = np.nan, np.nan
    if np.ptp(inv_e) > 1e-9 * inv_e.max():  # all E equal: the line is vertical
        slope, intercept = np.polyfit(inv_e, 1.0 / s, 1)
    if intercept > 0 and slope < 0:
        start = [math.log(1.0 / intercept), math.log(-slope)]
    else:  # the line is too noisy to start from; a neutral start inside the data
        start = [math.log(0.5 * s.min()), math.log(float(np.median(b)))]

    def resid(p: np.ndarray) -> np.ndarray:
        return np.log(s) - p[0] - np.log1p(np.exp(p[1]) / b)

    # B_crit is bounded to 1e-3..1e3 x the measured batches: a fit that runs to a bound means the
    # points show no trade-off (the data cannot identify B_crit), reported as such
    b_lo, b_hi = math.log(1e-3 * b.min()), math.log(1e3 * b.max())
    start[1] = min(max(start[1], b_lo + 1.0), b_hi - 1.0)
    res = least_squares(
        resid, start, bounds=([-np.inf, b_lo], [np.inf, b_hi]), method="trf",
        xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=2000,
    )  # fmt: skip
    if not np.all(np.isfinite(res.x)):
        raise AnalysisError(f"steps-data fit did not converge ({res.message}) for S={s.tolist()}.")
    s_min, b_crit = math.exp(res.x[0]), math.exp(res.x[1])
    if not (b_lo + 0.1 < res.x[1] < b_hi - 0.1):
        raise AnalysisError(
            f"these points show no steps-data trade-off (B_crit ran to {b_crit:.3g} tokens, far "
            f"outside the batches {b.min():.3g}..{b.max():.3g}): steps fall in proportion to the "
            "batch (B_crit above the range) or not at all (below it); measure a wider batch range."
        )
    if not res.success:
        raise AnalysisError(f"steps-data fit did not converge ({res.message}) for S={s.tolist()}.")
    dof = s.size - 2
    rss = float(np.sum(res.fun**2))
    jtj = res.jac.T @ res.jac
    if np.linalg.cond(jtj) > 1e12:
        raise AnalysisError("steps-data fit is not identifiable from these points (singular).")
    cov = rss / dof * np.linalg.inv(jtj)
    tq = float(stats.t.ppf(0.5 + confidence / 2.0, dof))

    def ci(log_value: float, var: float) -> tuple[float, float]:
        half = tq * math.sqrt(max(var, 0.0))
        return (math.exp(log_value - half), math.exp(log_value + half))

    log_e_min = res.x[0] + res.x[1]
    return StepsDataFit(
        s_min_steps=s_min,
        e_min_tokens=math.exp(log_e_min),
        b_crit_tokens=b_crit,
        s_min_ci=ci(res.x[0], cov[0, 0]),
        e_min_ci=ci(log_e_min, cov[0, 0] + cov[1, 1] + 2.0 * cov[0, 1]),
        b_crit_ci=ci(res.x[1], cov[1, 1]),
        n_points=int(s.size),
        residual_rms_log=math.sqrt(rss / s.size),
        confidence=float(confidence),
    )


# --- WSD: the three-stage E(S) of Zhou et al. 2026 (arXiv 2601.05034) -----------------------------

DEFAULT_NEAR_MIN_BAND = 0.15  # we choose: the transition stage is where E <= 1.15 * min E


@dataclass(frozen=True)
class WSDFit:
    """Piecewise E(S) for WSD schedules (Zhou et al. 2026, arXiv 2601.05034):

        E(S) = b_early / (S - s_min_steps) + e0_tokens          S <  split_steps[0]   (early)
             = c_quadratic (S - s_opt_steps)^2 + e_min_tokens   in between            (transition)
             = a1_tokens_per_step * S + a0_tokens               S >  split_steps[1]   (late)

    ``b_opt_tokens = e_min_tokens / s_opt_steps``: slope of the ray from the origin to the minimum,
    the batch that uses the least data. ``b_min_tokens = a1_tokens_per_step``: slope of the
    asymptote (``E/S -> A1`` as ``S -> inf``); below it the target is never reached. Stage
    boundaries are geometric midpoints between the last point of one stage and the first of the
    next. Per-stage residuals are relative (rms of ``fit/E - 1``).
    """

    s_opt_steps: float
    e_min_tokens: float
    c_quadratic: float
    a1_tokens_per_step: float
    a0_tokens: float
    b_early: float
    s_min_steps: float
    e0_tokens: float
    b_opt_tokens: float
    b_min_tokens: float
    split_steps: tuple[float, float]
    n_points_per_stage: tuple[int, int, int]
    residual_rms_rel_per_stage: tuple[float, float, float]

    def predict_tokens(self, steps: object) -> np.ndarray:
        s = np.asarray(steps, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            early = self.b_early / (s - self.s_min_steps) + self.e0_tokens
        mid = self.c_quadratic * (s - self.s_opt_steps) ** 2 + self.e_min_tokens
        late = self.a1_tokens_per_step * s + self.a0_tokens
        lo, hi = self.split_steps
        return np.where(s < lo, early, np.where(s > hi, late, mid))


def _split_regions(
    s: np.ndarray, e: np.ndarray, band: float, split_steps: tuple[float, float] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index arrays of the early, transition and late stages (disjoint, in order of S)."""
    idx = np.arange(s.size)
    if split_steps is not None:
        lo, hi = split_steps
        if not (0 < lo < hi):
            raise AnalysisError(f"split_steps must satisfy 0 < S1 < S2, got {split_steps}.")
        return idx[s < lo], idx[(s >= lo) & (s <= hi)], idx[s > hi]
    k = int(np.argmin(e))
    if k == 0 or k == s.size - 1:
        side = "larger batches (fewer steps)" if k == 0 else "smaller batches (more steps)"
        raise AnalysisError(
            f"the least data is used at the edge of the measured steps (S={s[k]:g}); E(S) has no "
            f"interior minimum here: measure {side}."
        )
    left, right = k - 1, k + 1
    while left > 0 and e[left - 1] <= (1.0 + band) * e[k]:
        left -= 1
    while right < s.size - 1 and e[right + 1] <= (1.0 + band) * e[k]:
        right += 1
    return idx[:left], idx[left : right + 1], idx[right + 1 :]


def _fit_early(s: np.ndarray, e: np.ndarray) -> tuple[float, float, float]:
    """``E = b / (S - S_min) + E0``: for fixed S_min it is linear in (b, E0); profile S_min."""

    def solve(s_min: float) -> tuple[float, float, float]:
        x = 1.0 / (s - s_min)
        design = np.column_stack([x, np.ones_like(x)]) / e[:, None]
        coef, *_ = np.linalg.lstsq(design, np.ones_like(e), rcond=None)
        rss = float(np.sum((design @ coef - 1.0) ** 2))
        return rss, float(coef[0]), float(coef[1])

    gap = s.min()  # S_min in [0, min S): search the gap min S - S_min on a log grid, then refine
    gaps = gap * np.logspace(-4, 0, 200)
    rss = [solve(s.min() - g)[0] for g in gaps]
    j = int(np.argmin(rss))
    lo, hi = gaps[max(j - 1, 0)], gaps[min(j + 1, gaps.size - 1)]
    opt = minimize_scalar(
        lambda lg: solve(s.min() - math.exp(lg))[0],
        bounds=(math.log(lo), math.log(hi)),
        method="bounded",
        options={"xatol": 1e-10},
    )
    if not opt.success:
        raise AnalysisError(f"early-stage E(S) fit did not converge ({opt.message}).")
    s_min = float(s.min() - math.exp(opt.x))
    _, b, e0 = solve(s_min)
    if not (math.isfinite(b) and b > 0):
        raise AnalysisError(
            f"early-stage points (S={s.tolist()}) do not fall as b/(S - S_min) + E0 with b > 0; "
            "check they are left of the minimum of E(S)."
        )
    return b, s_min, e0


def _fit_transition(sm: np.ndarray, em: np.ndarray) -> tuple[float, float, float]:
    """(S_opt, E_min, C) of the transition stage: a quadratic in S weighted by relative error, convex,
    with its vertex inside the stage (fit_wsd_data_curve's docstring)."""
    s_ref, e_ref = float(np.median(sm)), float(np.min(em))
    c2, c1, c0 = np.polyfit(sm / s_ref, em / e_ref, 2, w=e_ref / em)
    if not (np.isfinite([c2, c1, c0]).all() and c2 > 0):
        raise AnalysisError(
            f"transition stage (S={sm.tolist()}) is not convex; E(S) has no clear minimum there."
        )
    s_opt = -c1 / (2.0 * c2) * s_ref
    e_min = (c0 - c1**2 / (4.0 * c2)) * e_ref
    if not (sm.min() <= s_opt <= sm.max() and e_min > 0):
        raise AnalysisError(
            f"the fitted minimum of E(S) (S={s_opt:.4g}) lies outside the transition stage "
            f"{sm.min():g}..{sm.max():g}; measure more batches around it."
        )
    return s_opt, e_min, c2 * e_ref / s_ref**2


def fit_wsd_data_curve(
    steps: object,
    data: object,
    *,
    near_min_band: float = DEFAULT_NEAR_MIN_BAND,
    split_steps: tuple[float, float] | None = None,
) -> WSDFit:
    """Fit the three stages of E(S), each on its own region of the points.

    Region split (we choose): sort by S; the transition stage is the contiguous run of points
    around the measured minimum of E with ``E <= (1 + near_min_band) * min E``, always including
    one neighbour on each side; the early stage is every point at smaller S, the late stage every
    point at larger S. ``split_steps=(S1, S2)`` overrides this (early S < S1 <= transition <= S2 <
    late). Stage fits: transition, weighted quadratic (relative error) with C > 0 and its vertex
    inside the stage; late, weighted line with A1 > 0; early, profile least squares over S_min.
    Needs >= 3 early, >= 3 transition and >= 2 late points; fewer raise AnalysisError naming the
    stage. Also raises when B_min >= B_opt (stages split wrongly or data too noisy).
    """
    s, e = _points(steps, data)
    if np.unique(s).size != s.size:
        raise AnalysisError(f"steps must be distinct (one point per batch), got {s.tolist()}.")
    if not 0.0 < near_min_band < 1.0:
        raise AnalysisError(f"near_min_band must be in (0, 1), got {near_min_band}.")
    early, mid, late = _split_regions(s, e, near_min_band, split_steps)
    need = (("early", early, 3, "larger batches (fewer steps)"),
            ("transition", mid, 3, "batches near the data-optimal one"),
            ("late", late, 2, "smaller batches (more steps)"))  # fmt: skip
    for stage, ix, k, hint in need:
        if ix.size < k:
            raise AnalysisError(
                f"the {stage} stage of E(S) has {ix.size} point(s), needs >= {k}: measure more "
                f"{hint} to the same target loss."
            )

    sm = s[mid]
    s_opt, e_min, c_quad = _fit_transition(sm, e[mid])

    a1, a0 = np.polyfit(s[late], e[late], 1, w=1.0 / e[late])
    if not (np.isfinite([a1, a0]).all() and a1 > 0):
        raise AnalysisError(
            f"late stage (S={s[late].tolist()}) does not rise with S; its slope B_min is "
            "undefined. Measure smaller batches run longer."
        )
    b_early, s_min, e0 = _fit_early(s[early], e[early])

    b_opt, b_min = e_min / s_opt, float(a1)
    if b_min >= b_opt:
        raise AnalysisError(
            f"B_min ({b_min:.4g}) >= B_opt ({b_opt:.4g}): the stages are split wrongly or the "
            "points are too noisy; pass split_steps or measure more batches."
        )
    split = (math.sqrt(s[early][-1] * sm[0]), math.sqrt(sm[-1] * s[late][0]))
    fit = WSDFit(
        s_opt_steps=float(s_opt),
        e_min_tokens=float(e_min),
        c_quadratic=float(c_quad),
        a1_tokens_per_step=float(a1),
        a0_tokens=float(a0),
        b_early=b_early,
        s_min_steps=s_min,
        e0_tokens=e0,
        b_opt_tokens=float(b_opt),
        b_min_tokens=b_min,
        split_steps=split,
        n_points_per_stage=(int(early.size), int(mid.size), int(late.size)),
        residual_rms_rel_per_stage=(0.0, 0.0, 0.0),
    )
    rms_early, rms_mid, rms_late = (
        float(np.sqrt(np.mean((fit.predict_tokens(s[ix]) / e[ix] - 1.0) ** 2))) for ix in (early, mid, late)
    )
    return dataclasses.replace(fit, residual_rms_rel_per_stage=(rms_early, rms_mid, rms_late))


# Reference fits and schedules live in pretrain_schedule.py; re-exported for convenience.
from batchtune.analysis.pretrain.schedule import (  # noqa: E402
    ScheduleStage,
    WarmupStep,
    deepseek_bopt,
    deepseek_lr,
    kaplan_critical_batch,
    merrill_batch_warmup,
    schedule_from_bopt,
)

__all__ = [
    "StepsDataFit",
    "WSDFit",
    "fit_steps_data",
    "fit_wsd_data_curve",
    "ScheduleStage",
    "WarmupStep",
    "deepseek_bopt",
    "deepseek_lr",
    "kaplan_critical_batch",
    "merrill_batch_warmup",
    "schedule_from_bopt",
]
