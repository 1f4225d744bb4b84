"""R(B) fitted over every batch and seed at once, and its 1+tol crossing with a profile interval.

Model (log scale, one cell per run that reached the target):
    log R[b, s] = u_s + h(B_b; theta) + e[b, s],   e ~ N(0, sigma^2) independent,
u_s = log E_min of seed s. Seeds are paired (the same seed at every batch shares the sample
stream, warm start and prompt order), so a seed's luck moves all its batches together and
cancels from R(B)/R(B0) = exp(h(B) - h(B0)); with unpaired seeds one u is shared. Two shapes:
    mccandlish  h = log(1 + B / B_crit)          McCandlish et al. 2018, R = E_min (1 + B/B_crit)
    power       h = log(1 + (B / B_crit)^a)      a more flexible monotone alternative (a > 0)
For fixed theta the u_s are group means, so the residual sum of squares RSS(theta) is closed form
and is profiled on a grid (log-spaced B_crit, with B_crit = inf for "no penalty"; a in [0.25, 4]).
Interval for any function g(theta) (B_crit, the crossing): the profile-likelihood set
    {theta: (RSS(theta) - RSS_min) / (RSS_min / dof) <= F_{1, dof}(confidence)},
dof = cells - seed effects - shape parameters; its coverage is measured by
benchmarks/coverage_critical.py. Model choice by AIC = n log(RSS/n) + 2k; the power shape is
taken only when it beats McCandlish by more than 6 ("strong" evidence; at a margin of 2 it was
chosen in 10-17% of McCandlish-true simulations and those picks broke the coverage); whenever it
fits better by more than 2 (chosen or not), the crossing interval is the union of both shapes'
intervals, so a misspecified McCandlish shape (the NQM's flat-then-steep R(B)) cannot exclude the
truth on the strength of its own narrow interval.
Crossing of R(B)/R(B0) = 1 + tol: mccandlish B* = B0 (1 + tol) + tol B_crit;
power B* = B_crit ((1 + tol)(1 + (B0/B_crit)^a) - 1)^(1/a).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from batchtune.errors import AnalysisError

MODELS = ("mccandlish", "power")
_AIC_MARGIN = 6.0  # the flexible shape must beat McCandlish by this much AIC to be chosen
_AIC_AMBIGUOUS = 2.0  # from here up, the flexible shape fits better: report both shapes' crossings
_N_BCRIT = 321  # grid points of log B_crit, from B_min / 256 to B_max * 256
_EXPONENTS = np.exp(np.linspace(math.log(0.25), math.log(4.0), 41))


@dataclass(frozen=True)
class ShapeFit:
    """One model's joint fit of R(B): the estimate, its profile intervals and its quality.

    B_crit and crossings are in the caller's batch unit; `crossing_ci` is the interval of the
    1+tol crossing. `residual_rms_log`: sqrt(RSS / cells), the rms relative residual of a run
    about the fit after its seed effect. `sigma_log`: sqrt(RSS / dof), the per-run noise.
    `exponent` is 1 for mccandlish. inf B_crit / crossing: no large-batch penalty found.
    """

    model: str
    b_crit: float
    b_crit_ci: tuple[float, float]
    exponent: float
    crossing: float
    crossing_ci: tuple[float, float]
    rss_log: float
    residual_rms_log: float
    sigma_log: float
    aic: float
    n_params: int


@dataclass(frozen=True)
class JointFit:
    """Both shapes fitted to every run, and which one is used (`chosen`).

    `delta_aic` = AIC(mccandlish) - AIC(power): > 0 means the flexible shape fits better, > 6 chooses it.
    `paired`: seed effects were fitted (seed ids shared across batches). `n_cells`: runs used;
    `dof`: cells - seed effects - shape parameters of McCandlish.
    """

    mccandlish: ShapeFit
    power: ShapeFit | None
    chosen: str
    delta_aic: float
    paired: bool
    n_cells: int
    n_batches: int
    dof: int
    reference_batch: float
    tol: float
    confidence: float

    @property
    def best(self) -> ShapeFit:
        return self.power if self.chosen == "power" and self.power is not None else self.mccandlish

    def describe(self, with_crossing: bool = True) -> str:
        """One line: the chosen model, its crossing with interval (unless ``with_crossing`` is
        False: where a report quotes the shape-free crossing instead), and its fit quality."""
        f = self.best
        other = (
            f"power a={self.power.exponent:.2f} dAIC(mcc-pow)={self.delta_aic:+.1f}"
            if self.power is not None
            else "power not fitted"
        )
        conf = f"{100 * self.confidence:.0f}%"
        cross = (
            f"1+tol crossing {_g(f.crossing)} [{_g(f.crossing_ci[0])}, {_g(f.crossing_ci[1])}] ({conf}), "
            if with_crossing
            else ""
        )
        return (
            f"joint {f.model} fit: B_crit {_g(f.b_crit)} [{_g(f.b_crit_ci[0])}, {_g(f.b_crit_ci[1])}]"
            f"{'' if with_crossing else f' ({conf})'}, {cross}residual rms {100 * f.residual_rms_log:.1f}% "
            f"over {self.n_cells} runs ({'paired' if self.paired else 'unpaired'} seeds); {other}"
        )


def _g(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4g}"


def _crossing(b0: float, tol: float, b_crit: np.ndarray, a: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inner = (1.0 + tol) * (1.0 + (b0 / b_crit) ** a) - 1.0
        out = b_crit * inner ** (1.0 / a)
    return np.where(np.isinf(b_crit), math.inf, out)


def _profile_rss(y: np.ndarray, bidx: np.ndarray, onehot: np.ndarray, h: np.ndarray) -> np.ndarray:
    """RSS for each shape row of h (G, n_batches), seed effects profiled out (group means)."""
    resid = y[None, :] - h[:, bidx]  # (G, cells)
    u = (resid @ onehot) / onehot.sum(axis=0)  # (G, seeds)
    return np.sum((resid - u @ onehot.T) ** 2, axis=1)


def _interval(values: np.ndarray, keep: np.ndarray) -> tuple[float, float]:
    v = values[keep]
    return float(np.min(v)), float(np.max(v))


def fit_joint(
    batches: ArrayLike,
    samples_to_target: ArrayLike,
    seeds: ArrayLike | None = None,
    *,
    reference_batch: float | None = None,
    tol: float = 0.1,
    confidence: float = 0.9,
) -> JointFit:
    """Fit R(B) jointly over runs (one entry per run that reached the target) and find the crossing.

    `seeds[i]` is run i's seed id; runs sharing a seed id at different batches are paired. None
    (or every id used once) fits one shared E_min. The reference B0 defaults to the smallest batch.
    Raises AnalysisError when fewer than two batches, or no degree of freedom is left for the
    noise, or the values are not finite and positive.
    """
    b, r = _checked(batches, samples_to_target, tol, confidence)
    ub, bidx = np.unique(b, return_inverse=True)
    if ub.size < 2:
        raise AnalysisError(
            f"a joint fit needs at least two batches that reached the target, got {ub.tolist()}"
        )
    onehot, paired = _seed_effects(b.size, seeds)
    n, n_u = b.size, onehot.shape[1]
    dof = n - n_u - 1
    if dof < 1:
        raise AnalysisError(
            f"{n} runs over {ub.size} batches leave no degree of freedom for the noise after "
            f"{n_u} seed effect(s) and B_crit; run more seeds or batches"
        )
    b0 = float(ub[0] if reference_batch is None else reference_batch)
    y = np.log(r)
    fcrit = float(stats.f.ppf(confidence, 1, dof))

    def rss_of(bc: np.ndarray, a: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", divide="ignore"):
            return _profile_rss(y, bidx, onehot, np.log1p((ub[None, :] / bc[:, None]) ** a[:, None]))

    coarse = np.r_[np.geomspace(ub[0] / 256, ub[-1] * 256, _N_BCRIT), math.inf]
    bc1, a1 = _zoom(coarse, np.ones_like(coarse), rss_of, dof, fcrit, n, flexible=False)
    mcc = _shape_fit("mccandlish", bc1, a1, rss_of(bc1, a1), n, n_u + 1, dof, fcrit, b0, tol)
    power = None
    dof2 = n - n_u - 2
    if dof2 >= 1 and ub.size >= 3:
        f2 = float(stats.f.ppf(confidence, 1, dof2))
        gb, ga = (g.ravel() for g in np.meshgrid(coarse, _EXPONENTS, indexing="ij"))
        bc2, a2 = _zoom(gb, ga, rss_of, dof2, f2, n, flexible=True)
        power = _shape_fit("power", bc2, a2, rss_of(bc2, a2), n, n_u + 2, dof2, f2, b0, tol)
    mcc, power, chosen, delta = _choose(mcc, power)
    return JointFit(
        mccandlish=mcc,
        power=power,
        chosen=chosen,
        delta_aic=delta,
        paired=paired,
        n_cells=n,
        n_batches=int(ub.size),
        dof=dof,
        reference_batch=b0,
        tol=tol,
        confidence=confidence,
    )


def _checked(
    batches: ArrayLike, samples_to_target: ArrayLike, tol: float, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """fit_joint's inputs as arrays, refused unless one finite positive (B, R) per run."""
    b = np.asarray(batches, dtype=float)
    r = np.asarray(samples_to_target, dtype=float)
    if b.ndim != 1 or b.shape != r.shape or b.size == 0:
        raise AnalysisError("fit_joint needs 1-D batches and samples_to_target of equal length, one per run")
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(r)) and np.all(b > 0) and np.all(r > 0)):
        raise AnalysisError("fit_joint needs finite, positive batches and R; drop censored runs first")
    if not 0.0 < confidence < 1.0 or math.isnan(tol) or tol < 0:
        raise AnalysisError(f"need 0 < confidence < 1 and tol >= 0, got {confidence}, {tol}")
    return b, r


def _seed_effects(n: int, seeds: ArrayLike | None) -> tuple[np.ndarray, bool]:
    """The one-hot design of the seed effects (n runs x seeds used) and whether runs are paired:
    at least two seed ids used by two runs or more; else one shared column (one E_min)."""
    sid = np.zeros(n, dtype=int) if seeds is None else np.unique(np.asarray(seeds), return_inverse=True)[1]
    counts = np.bincount(sid)
    paired = bool(np.sum(counts >= 2) >= 2)
    if not paired:
        sid = np.zeros(n, dtype=int)
    onehot = np.eye(sid.max() + 1)[sid]
    return onehot[:, onehot.sum(axis=0) > 0], paired


def _choose(mcc: ShapeFit, power: ShapeFit | None) -> tuple[ShapeFit, ShapeFit | None, str, float]:
    """(mcc, power, the chosen shape, AIC(mcc) - AIC(power)): the power law only when its AIC is
    clearly lower; where the data lean to it without deciding, the chosen one's interval covers both."""
    delta = mcc.aic - power.aic if power is not None else math.nan
    chosen = "power" if power is not None and delta > _AIC_MARGIN else "mccandlish"
    if power is not None and delta > _AIC_AMBIGUOUS:  # honest about the model choice: both intervals
        lo = min(power.crossing_ci[0], mcc.crossing_ci[0])
        hi = max(power.crossing_ci[1], mcc.crossing_ci[1])
        if chosen == "power":
            power = dataclasses.replace(power, crossing_ci=(lo, hi))
        else:  # the data lean to the flexible shape without deciding: the answer is either's
            mcc = dataclasses.replace(mcc, crossing_ci=(lo, hi))
    return mcc, power, chosen, delta


def _zoom(
    bc: np.ndarray,
    a: np.ndarray,
    rss_of: Callable[[np.ndarray, np.ndarray], np.ndarray],
    dof: int,
    fcrit: float,
    n: int,
    *,
    flexible: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """The coarse grid plus a fine grid over its (widened) profile set, so the interval ends are
    resolved to ~0.5% instead of the coarse step (a coarse set shrinks the interval)."""
    rss = rss_of(bc, a)
    rmin = float(np.min(rss))
    keep = (rss - rmin) / (max(rmin, 1e-12 * n) / dof) <= 2.0 * fcrit
    step = float(bc[1] / bc[0])
    fb = bc[keep & np.isfinite(bc)]
    lo, hi = (fb.min() / step, fb.max() * step) if fb.size else (bc[-2] / step, bc[-2])
    fine_b = np.geomspace(lo, hi, 120 if flexible else 600)
    if np.any(keep & np.isinf(bc)):
        fine_b = np.r_[fine_b, math.inf]
    fine_a = np.ones(1)
    if flexible:
        astep = float(_EXPONENTS[1] / _EXPONENTS[0])
        ka = a[keep]
        fine_a = np.geomspace(max(ka.min() / astep, _EXPONENTS[0]), min(ka.max() * astep, _EXPONENTS[-1]), 40)
    gb, ga = (g.ravel() for g in np.meshgrid(fine_b, fine_a, indexing="ij"))
    return np.r_[bc, gb], np.r_[a, ga]


def _shape_fit(
    model: str,
    b_crit: np.ndarray,
    a: np.ndarray,
    rss: np.ndarray,
    n: int,
    k: int,
    dof: int,
    fcrit: float,
    b0: float,
    tol: float,
) -> ShapeFit:
    if not np.all(np.isfinite(rss)):
        raise AnalysisError(f"the {model} joint fit produced a non-finite residual; check the inputs")
    i = int(np.argmin(rss))
    rss_min = float(rss[i])
    floor = max(rss_min, 1e-12 * n)  # exact data: an interval of the grid's resolution
    keep = (rss - rss_min) / (floor / dof) <= fcrit
    cross = _crossing(b0, tol, b_crit, a)
    return ShapeFit(
        model=model,
        b_crit=float(b_crit[i]),
        b_crit_ci=_interval(b_crit, keep),
        exponent=float(a[i]),
        crossing=float(cross[i]),
        crossing_ci=_interval(cross, keep),
        rss_log=rss_min,
        residual_rms_log=math.sqrt(rss_min / n),
        sigma_log=math.sqrt(rss_min / dof),
        aic=n * math.log(floor / n) + 2 * k,
        n_params=k,
    )
