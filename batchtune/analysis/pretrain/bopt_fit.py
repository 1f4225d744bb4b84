"""B_opt at one target loss from steps to target per seed and batch (docs/method.md §6, issue 32).

Two fits, in this order; the measured minimum (the grid batch with the fewest median tokens to the
target) and its bracket (its grid neighbours) are always reported beside them:

- **Window fit** (:func:`window_fit`): a cubic in ``(log B, log E)`` through every batch from 1.5
  octaves below to 2 above the minimum of the per-batch means of log E, weighted by each batch's
  seeds over its seed variance of log E (shrunk towards the window's pooled variance), minimised
  over the window. Near B_opt E(B) is flat, so loss noise moves the measured minimum among close
  batches; a fit across 3.5 octaves averages it, and the weights keep the batches near B_min
  (whose steps to target are the noisiest) from bending it. Accepted when the window holds at
  least ``WINDOW_POINTS`` batches every seed of which reached the target, the minimum is interior
  and the weighted rms log residual is <= ``max_resid``. Batches with more seeds (the refinement's
  seed rounds, measure/pretrain_refine.py) weigh more. Measured (benchmarks/
  pretrain_refine_recovery.py, SynthLaw curves with 1% loss noise and 3 seeds, refined grid): within
  15% in 51 of 55 cases (50 and 50 on two other draws of 55), where the unweighted cubic over 1.5
  octaves either side of the medians was in 35 (39 and 43).
- **Five-point fit** (:func:`five_point_fit`), where the window fit is not accepted: a polynomial
  through the measured minimum and up to the four reached batches nearest it (a cubic with 5
  points, a parabola with 3-4), accepted when interior to the bracket with rms log residual <=
  ``max_resid``; otherwise the measured minimum is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# the window fit spans 1.5 octaves below the minimum of the mean log E and 2 above it: E(B) rises
# faster towards B_min than above B_opt, and a cubic over 2 octaves below read up to 15% off on
# exact three-stage data (benchmarks/pretrain_refine_recovery.py); measured against 1.5 and 2
# octaves either side, 1 below and 2-3 above, and Gaussian-weighted windows (docs/pretraining.md)
WINDOW_BELOW, WINDOW_ABOVE = 2.0**1.5, 4.0
WINDOW_POINTS = 5  # a cubic through at least this many batches (one degree of freedom left)
PRIOR_DOF = 2.0  # the pooled variance counts as this many seeds in each batch's shrunk variance
NOISE_FACTOR = 3.0  # a weighted fit may miss the means by this many standard errors (rms)


def log_tokens_per_seed(b: np.ndarray, s: np.ndarray) -> list[np.ndarray]:
    """Per batch, log tokens to target of each seed that ran it (nan = not run dropped; -> inf kept)."""
    return [np.log(b[j] * s[~np.isnan(s[:, j]), j]) for j in range(b.size)]


def _shrunk_var(logs: list[np.ndarray], ok: np.ndarray) -> np.ndarray:
    """Per batch, its seed variance of log E shrunk towards the pooled (median) variance of the
    batches ``ok``; nan everywhere when no batch has two seeds."""
    n = np.array([x.size for x in logs], dtype=float)
    var = np.array([np.var(x, ddof=1) if x.size >= 2 and ok[j] else np.nan for j, x in enumerate(logs)])
    if not np.isfinite(var).any():
        return np.full(n.size, np.nan)
    pooled = max(float(np.nanmedian(var)), 1e-12)
    dof = np.maximum(n - 1, 0)
    return (PRIOR_DOF * pooled + dof * np.nan_to_num(var, nan=pooled)) / (PRIOR_DOF + dof)


@dataclass(frozen=True)
class SeedMeans:
    """Per batch: whether every seed that ran it reached the target, the mean log tokens over
    those seeds, the seeds, and the shrunk seed variance (nan with one seed each)."""

    ok: np.ndarray
    mean: np.ndarray
    n: np.ndarray
    var: np.ndarray

    @classmethod
    def of(cls, b: np.ndarray, s: np.ndarray) -> SeedMeans:
        logs = log_tokens_per_seed(b, s)
        ok = np.array([x.size > 0 and bool(np.isfinite(x).all()) for x in logs])
        mean = np.array([float(x.mean()) if good else np.inf for x, good in zip(logs, ok, strict=True)])
        return cls(ok, mean, np.array([x.size for x in logs], dtype=float), _shrunk_var(logs, ok))

    @property
    def noise_known(self) -> bool:
        return bool(np.isfinite(self.var).all())

    def weights(self) -> np.ndarray:
        """sqrt(seeds / shrunk variance); sqrt(seeds) with one seed each."""
        return np.sqrt(self.n / (self.var if self.noise_known else 1.0))


def window_fit(b: np.ndarray, s: np.ndarray, max_resid: float) -> tuple[float, float] | None:
    """(B_opt, weighted rms log residual) from the window fit (module docstring), or None."""
    m = SeedMeans.of(b, s)
    return fit_means(b, m.mean, m.ok, m.weights(), max_resid, m.noise_known)


def _misfit_allowed(w: np.ndarray, max_resid: float) -> float:
    """The weighted rms residual a fit may have: ``max_resid``, or the noise of the means when
    the seeds say it is larger (NOISE_FACTOR standard errors, weighted like the residual)."""
    noise = math.sqrt(w.size / float(np.sum(w**2)))  # weights are sqrt(n / var): rms of var / n
    return max(max_resid, NOISE_FACTOR * noise)


def fit_means(
    b: np.ndarray,
    mean: np.ndarray,
    ok: np.ndarray,
    w: np.ndarray,
    max_resid: float,
    weighted: bool,
    window: tuple[float, float] = (WINDOW_BELOW, WINDOW_ABOVE),
) -> tuple[float, float] | None:
    """The window fit of per-batch mean log tokens ``mean`` (batches ``ok``) at weights ``w``
    (``weighted``: sqrt(seeds / variance), which also lets the misfit reach the noise)."""
    if ok.sum() < WINDOW_POINTS:
        return None
    k = int(np.argmin(np.where(ok, mean, np.inf)))
    d = np.log(b / b[k])
    top = math.log(window[1]) * (1 + 1e-9)
    above = ok & (d > 0) & (d <= top)
    if not above.any():
        return None
    # no wider below than above (and at least an octave): a lopsided window bends the vertex
    below = min(math.log(window[0]), max(float(d[above].max()), math.log(2.0)))
    sel = ok & (d >= -below * (1 + 1e-9)) & (d <= top)
    if sel.sum() < WINDOW_POINTS or not (sel & (d < 0)).any():
        return None
    u, v, ws = np.log(b[sel]), mean[sel], w[sel]
    u0 = float(u.mean())
    coef = np.polyfit(u - u0, v, 3, w=ws)
    r = np.polyval(coef, u - u0) - v
    resid = float(np.sqrt(np.sum((ws * r) ** 2) / np.sum(ws**2)))
    allowed = _misfit_allowed(ws, max_resid) if weighted else max_resid
    x = _interior_minimum(coef, float(u.min()) - u0, float(u.max()) - u0)
    if x is None or resid > allowed:
        return None
    return math.exp(x + u0), resid


def _interior_minimum(coef: np.ndarray, lo: float, hi: float) -> float | None:
    """Where the polynomial ``coef`` is lowest on [lo, hi], when that is a stationary point
    strictly inside (not an end): its derivative's real roots there, against both ends."""
    roots = np.roots(np.polyder(coef))
    inside = [float(r.real) for r in roots if abs(r.imag) < 1e-12 and lo < r.real < hi]
    cands = [lo, hi, *inside]
    vals = np.polyval(coef, cands)
    j = int(np.argmin(vals))
    return cands[j] if j >= 2 and vals[j] < min(vals[0], vals[1]) else None


def five_point_fit(
    b: np.ndarray, e: np.ndarray, k: int, max_resid: float
) -> tuple[float | None, float | None, str | None]:
    """(fit, rms log residual, note when rejected) from per-batch tokens ``e`` (inf = never reached)
    around the measured minimum ``k``: the 5 reached batches nearest it (contiguous), balanced where
    the grid allows; None where fewer than 3 or ``k`` is at an end of the grid."""
    ok = np.isfinite(e)
    lo_i, hi_i = k, k
    while hi_i - lo_i < 4:
        can_lo = lo_i > 0 and ok[lo_i - 1]
        can_hi = hi_i < b.size - 1 and ok[hi_i + 1]
        if not (can_lo or can_hi):
            break
        if can_lo and (k - lo_i <= hi_i - k or not can_hi):
            lo_i -= 1
        else:
            hi_i += 1
    idx = list(range(lo_i, hi_i + 1))
    if len(idx) < 3 or not 0 < k < b.size - 1:
        return None, None, None
    lo, hi = b[k - 1], b[k + 1]
    u, v = np.log(b[idx]), np.log(e[idx])
    u0 = float(u.mean())
    coef = np.polyfit(u - u0, v, 3 if len(idx) >= 5 else 2)  # a cubic follows E(B)'s skew
    resid = float(np.sqrt(np.mean((np.polyval(coef, u - u0) - v) ** 2)))
    grid = np.linspace(math.log(lo), math.log(hi), 2001)
    j = int(np.argmin(np.polyval(coef, grid - u0)))
    vertex = math.exp(grid[j])
    interior = 0 < j < grid.size - 1
    if interior and resid <= max_resid:
        return vertex, resid, None
    return (
        None,
        resid,
        f"B_opt local fit rejected (minimum {vertex:.4g} {'inside' if interior else 'at an end of'} "
        f"the bracket {lo:.4g}..{hi:.4g}, rms log residual {resid:.3f}): reporting the measured minimum",
    )


def fit_b_opt(
    b: np.ndarray, s: np.ndarray, e_med: np.ndarray, max_resid: float
) -> tuple[float | None, tuple[float, float] | None, float | None, float | None, list[str], bool]:
    """(measured, bracket, fit, fit residual, notes, whether the fit is the window fit) from steps
    ``s`` (seeds x batches; inf = never reached, nan = not run) and the per-batch median tokens ``e_med``."""
    ok = np.isfinite(e_med)
    if not ok.any():
        return None, None, None, None, ["no batch reached this target"], False
    k = int(np.argmin(np.where(ok, e_med, np.inf)))
    notes: list[str] = []
    lo = b[k - 1] if k > 0 else b[k]
    hi = b[k + 1] if k < b.size - 1 else b[k]
    if k == 0 or k == b.size - 1:
        edge = "smallest" if k == 0 else "largest"
        notes.append(f"fewest tokens at the {edge} measured batch: B_opt may lie beyond the grid")
    else:
        win = window_fit(b, s, max_resid)
        if win is not None:
            return float(b[k]), (float(lo), float(hi)), win[0], win[1], notes, True
    fit, resid, why = five_point_fit(b, e_med, k, max_resid)
    return float(b[k]), (float(lo), float(hi)), fit, resid, notes + ([why] if why else []), False
