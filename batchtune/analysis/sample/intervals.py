"""What an interval is, in words, and intervals that do not lean on one model of R(B).

`interval_kind` names a samples-to-target interval for a report. The bootstrap percentile
interval of the median over up to 7 seeds is the seeds' [min, max]: for the median of R it is a
75% interval with 3 seeds (1 - 2 / 2^3), and one new run (the full run a user makes next) falls
inside it with probability (n - 1) / (n + 1), 50% with 3 seeds. So it is named "range of N seeds"
and never "90%".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import isotonic_regression

from batchtune.analysis.sample.seeds import MEDIAN, TargetEstimate
from batchtune.errors import AnalysisError


def interval_kind(est: TargetEstimate, scale_ci: tuple[float, float] = (1.0, 1.0)) -> str:
    """What (ci_low, ci_high) of ``est`` is (times ``scale_ci``: a branched trunk's extrapolation)."""
    if est.no_interval:
        kind = "one seed, no interval"
    else:
        vals = est.seed_values()
        rng = (float(vals.min()), float(vals.max()))
        if est.statistic == MEDIAN and (est.ci_low, est.ci_high) == rng:
            kind = f"range of {est.n_seeds} seeds"
        else:
            kind = f"{est.confidence:.0%} bootstrap interval over {est.n_seeds} seeds"
    return kind if tuple(scale_ci) == (1.0, 1.0) else f"{kind} x the trunk's extrapolation interval"


def ci_header(estimates: list[TargetEstimate | None]) -> str:
    """A table's column head for the R intervals: "seed range" when every one is its seeds'
    [min, max] (3 seeds: not a 90% interval), else "interval"."""
    kinds = {interval_kind(e) for e in estimates if e is not None and not e.no_interval}
    return "seed range" if kinds and all(k.startswith("range of") for k in kinds) else "interval"


# ---- the 1+tol crossing without a model of R(B) --------------------------------------------------
#
# Data: log R[b, s] = u_s + h_b + e (seeds paired, h free at each measured batch: no shape).
# Between two measured batches the ratio q(B) = exp(h(B) - h(B0)) is unknown; if it is convex on
# the three or four batches around the crossing (flat then steep: the NQM) or concave, the crossing
# lies between the chord's crossing and the crossing of the secant through the neighbouring pair
# (extended across the bracket): one is a lower bound L and the other an upper bound U whichever way
# it bends, and for McCandlish's linear R(B) all of them are the crossing itself. The crossing is
# one point of [L, U] and the measured batches say nothing about where: each draw of a parametric
# bootstrap of the additive model (noise drawn at the fitted per-run sigma, itself drawn from its
# chi-square law) places it uniformly in log B between its own L and U, and the interval is the
# (1-c)/2 and (1+c)/2 quantiles of those draws (a shape-averaged interval: an average over the
# bendings the bounds allow, weighted evenly in log B). Where L = U it is the plain percentile
# interval of the crossing. Taking the (1-c)/2 quantile of L and the (1+c)/2 quantile of U instead
# (before 2026-12-03) holds the whole set [L, U] at c, which covers the one crossing in it more
# often than c: 97.6% at c = 90% on the NQM (benchmarks/out/coverage_shape_free.txt). A crossing
# past the last measured batch is open up to the first failed batch (or infinity: no critical batch
# in the measured range); a draw open to infinity counts as infinite.

N_BOOT = 400
_SWEEPS = 30  # alternating-means sweeps of the additive fit (exact after one with balanced seeds)


@dataclass(frozen=True)
class ShapeFreeCrossing:
    """The 1+tol crossing of R(B)/R(B0) read off the measured batches, with a shape-free interval.

    `crossing`: the geometric middle of the bounds [L, U] of the monotone per-batch ratios (the
    median of a crossing placed uniformly in log B between them; the linear interpolation in B
    where they agree); inf when no measured batch reaches 1 + tol and nothing failed above (then
    `ci` is [last batch, inf)). `chord`: the linear interpolation in B of the ratios (L on a convex
    R(B), U on a concave one). `ci`: the shape-averaged interval of the module comment; its
    coverage is measured by benchmarks/coverage_shape_free.py.
    `sigma_log`: the per-run noise of the additive fit; `dof` its degrees of freedom.
    """

    crossing: float
    ci: tuple[float, float]
    bracket: tuple[float, float]  # the measured batches either side of the crossing
    sigma_log: float
    dof: int
    confidence: float
    reference_batch: float = math.nan
    tol: float = 0.1
    chord: float = math.nan

    @property
    def b_crit_ci(self) -> tuple[float, float]:
        """B_crit of the McCandlish curve with the same crossing, B* = B0 (1 + tol) + tol B_crit,
        over the interval: on McCandlish curves it is B_crit, and it covers as the crossing does."""
        b0, t = self.reference_batch, self.tol
        lo, hi = ((x - b0 * (1 + t)) / t if t > 0 else math.nan for x in self.ci)
        return max(lo, 0.0), hi

    @property
    def open_above(self) -> bool:
        """True when the interval reaches perfect scaling: no critical batch in the measured range."""
        return math.isinf(self.ci[1])


def _additive(
    y: np.ndarray, bidx: np.ndarray, sidx: np.ndarray, nb: int, ns: int
) -> tuple[np.ndarray, np.ndarray]:
    """(h (reps, nb), fitted (reps, cells)) of y (reps, cells) = u_s + h_b by alternating means;
    h[:, 0] = 0 (the reference)."""
    cb = np.bincount(bidx, minlength=nb).astype(float)
    cs = np.bincount(sidx, minlength=ns).astype(float)
    b_hot = np.eye(nb)[bidx]
    s_hot = np.eye(ns)[sidx]
    u = np.zeros((y.shape[0], ns))
    h = np.zeros((y.shape[0], nb))
    balanced = np.unique(cb).size == 1 and np.unique(cs).size == 1
    for _ in range(2 if balanced else _SWEEPS):
        h = ((y - u @ s_hot.T) @ b_hot) / cb
        u = ((y - h @ b_hot.T) @ s_hot) / cs
    fitted = h @ b_hot.T + u @ s_hot.T
    return h - h[:, :1], fitted


_PRIOR_DOF = 1.0  # the pooled noise counts as this many degrees of freedom in each batch's own


def _run_sigma(resid: np.ndarray, bidx: np.ndarray, nb: int, dof: int, sigma: float) -> np.ndarray:
    """Each run's noise: its batch's residual spread shrunk toward the pooled sigma. Near the
    stability edge a batch's seeds scatter far more than the small batches' do, and one pooled
    level would push that scatter onto every batch (the crossing's interval then reached down to
    the reference on the NQM)."""
    n = resid.size
    d_b = np.bincount(bidx, minlength=nb) * dof / n  # each batch's share of the degrees of freedom
    rss_b = np.bincount(bidx, weights=resid**2, minlength=nb)
    var_b = (rss_b + _PRIOR_DOF * sigma**2) / (d_b + _PRIOR_DOF)
    return np.sqrt(var_b)[bidx]


def _bounds(b: np.ndarray, q: np.ndarray, level: float, failed_from: float) -> tuple[float, float, float]:
    """(chord crossing, lower bound, upper bound) of q(B) = level from monotone ratios q at b."""
    above = np.flatnonzero(q > level)
    if above.size == 0:
        return math.inf, float(b[-1]), failed_from
    k = int(above[0])
    b0, b1, q0, q1 = b[k - 1], b[k], q[k - 1], q[k]
    chord = float(b0 + (level - q0) / (q1 - q0) * (b1 - b0))
    cands = [chord]
    if k >= 2 and q0 > q[k - 2]:  # the secant below, extended up
        cands.append(b0 + (level - q0) * (b0 - b[k - 2]) / (q0 - q[k - 2]))
    elif k >= 2:  # flat below: a convex curve can cross anywhere up to b1
        cands.append(b1)
    if k + 1 < b.size and q[k + 1] > q1:  # the secant above, extended down
        cands.append(b1 - (q1 - level) * (b[k + 1] - b1) / (q[k + 1] - q1))
    elif k + 1 >= b.size and k < 2:  # nothing either side to bend by: the bracket
        cands += [b0, b1]
    c = np.clip(np.array(cands), b0, b1)
    return chord, float(c.min()), float(c.max())


def _common_seeds(b: np.ndarray, r: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs of the seeds measured at every batch, when there are two or more of them. Extra
    seeds at a few batches (sequential seeding) have seed effects fixed only by those batches:
    at the stability edge their scatter moved the reference's fit and read the small batches as
    3% slower than the reference on the NQM; seed by seed they were within 0.2%."""
    every = set(s[b == b[0]].tolist())
    for x in np.unique(b):
        every &= set(s[b == x].tolist())
    if len(every) < 2:
        return b, r, s
    keep = np.isin(s, sorted(every))
    return b[keep], r[keep], s[keep]


def shape_free_crossing(
    batches: Sequence[float],
    samples_to_target: Sequence[float],
    seeds: Sequence[int],
    *,
    reference_batch: float,
    tol: float = 0.1,
    confidence: float = 0.9,
    failed_from: float | None = None,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> ShapeFreeCrossing:
    """The crossing and its interval from one (batch, R, seed id) per run that reached the target
    (runs at or above `failed_from` left out by the caller; seeds paired by id). Raises
    AnalysisError when the reference is not among the batches or no degree of freedom is left."""
    b, r, sd = _common_seeds(
        np.asarray(batches, float), np.asarray(samples_to_target, float), np.asarray(seeds)
    )
    y = np.log(r)
    ub, bidx = np.unique(b, return_inverse=True)
    _, sidx = np.unique(sd, return_inverse=True)
    nb, ns = int(ub.size), int(sidx.max()) + 1
    if ub[0] != reference_batch:
        raise AnalysisError(f"the reference {reference_batch:g} is not the smallest batch that reached")
    dof = int(b.size - nb - ns + 1)
    if nb < 2 or dof < 1:
        raise AnalysisError(f"{b.size} runs over {nb} batches and {ns} seeds leave no degree of freedom")
    top = math.inf if failed_from is None else float(failed_from)
    h, fitted = _additive(y[None, :], bidx, sidx, nb, ns)
    sigma = math.sqrt(float(np.sum((y - fitted[0]) ** 2)) / dof)
    level = 1.0 + tol
    weights = np.bincount(bidx, minlength=nb).astype(float)

    def monotone(hh: np.ndarray) -> np.ndarray:
        return np.asarray(isotonic_regression(np.exp(hh), weights=weights, increasing=True).x, dtype=float)

    chord, lo0, hi0 = _bounds(ub, monotone(h[0]), level, top)
    point = _log_mid(lo0, hi0, 0.5)
    rng = np.random.default_rng(seed)
    s_draw = np.sqrt(dof / rng.chisquare(dof, size=n_boot))
    ys = fitted + s_draw[:, None] * _run_sigma(y - fitted[0], bidx, nb, dof, sigma) * rng.standard_normal(
        (n_boot, b.size)
    )
    hs, _ = _additive(ys, bidx, sidx, nb, ns)
    ends = np.array([_bounds(ub, monotone(hh), level, top)[1:] for hh in hs])
    draws = _log_mid(ends[:, 0], ends[:, 1], rng.uniform(size=n_boot))
    alpha = (1.0 - confidence) / 2.0
    floor = lo0 if math.isinf(point) else point  # the interval holds the crossing it quotes
    lo = float(min(np.quantile(draws, alpha, method="inverted_cdf"), floor))
    hi = float(max(np.quantile(draws, 1.0 - alpha, method="inverted_cdf"), point))
    below = ub[ub <= point] if math.isfinite(point) else ub
    k = int(below.size - 1)
    bracket = (float(ub[k]), float(ub[k + 1]) if k + 1 < nb else top)
    return ShapeFreeCrossing(
        point, (lo, hi), bracket, sigma, dof, confidence, float(reference_batch), tol, float(chord)
    )


def _log_mid(lo: Any, hi: Any, u: Any) -> Any:
    """lo (hi / lo)^u: the point a share u of the way from lo to hi in log B (inf when hi is)."""
    lo_a, hi_a = np.asarray(lo, float), np.asarray(hi, float)
    with np.errstate(invalid="ignore", over="ignore"):
        out = np.where(np.isinf(hi_a), math.inf, lo_a * (hi_a / lo_a) ** np.asarray(u, float))
    return float(out) if out.ndim == 0 else out


def _n(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4g}"


def crossing_words(sf: ShapeFreeCrossing | None, model_ci: tuple[float, float] | None, unit: str) -> str:
    """The crossing as a report says it: "no critical batch in the measured range" whenever the
    shape-free interval (or the model's) reaches perfect scaling, else the crossing with its
    shape-free interval; "" when there is neither."""
    conf = f"{100 * sf.confidence:.0f}%" if sf is not None else "90%"
    if (sf is not None and sf.open_above) or (model_ci is not None and math.isinf(model_ci[1])):
        lo = sf.ci[0] if sf is not None else model_ci[0] if model_ci is not None else math.nan
        return (
            f"no critical batch in the measured range: R(B)/R(B0) may stay within 1+tol past every "
            f"measured batch (the {conf} interval of the 1+tol crossing is [{_n(lo)} {unit}, inf), "
            "perfect scaling included)"
        )
    if sf is None:
        return ""
    return (
        f"R(B)/R(B0) reaches 1+tol at {_n(sf.crossing)} between the measured batches "
        f"{_n(sf.bracket[0])} and {_n(sf.bracket[1])} ({conf} shape-free interval "
        f"[{_n(sf.ci[0])}, {_n(sf.ci[1])}])"
    )
