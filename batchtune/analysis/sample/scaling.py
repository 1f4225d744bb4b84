"""The steps/samples trade-off between measured batches (docs/method.md §3.4).

McCandlish et al. 2018, "An Empirical Model of Large-Batch Training" (arXiv 1812.06162):
    (S / S_min - 1) (E / E_min - 1) = 1, so
    R(B) = E_min (1 + B / B_crit) = E_min + S_min * B      (samples to target, linear in B)
    S(B) = S_min (1 + B_crit / B)                          (steps to target)
    B_crit = E_min / S_min.
Pollux / AdaptDL (Qiao et al. 2021) uses the same form as a statistical efficiency
    eff(B) = (B_noise + B0) / (B_noise + B).
The model interpolates and extrapolates with an honest band; it never overrules measured points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from batchtune.analysis.sample.seeds import percentile_interval
from batchtune.errors import AnalysisError

_N_DRAWS = 4000  # Monte Carlo draws of the fitted parameters for the B_crit interval
_IRLS_MAX_ITER = 100
_IRLS_RTOL = 1e-10

Cov = tuple[tuple[float, float], tuple[float, float]]


def mccandlish_samples(batch: ArrayLike, e_min_samples: float, b_crit: float) -> np.ndarray:
    """R(B) = E_min (1 + B / B_crit) (McCandlish et al. 2018, eq. 2.11); B_crit = inf gives E_min."""
    b = np.asarray(batch, dtype=float)
    if math.isinf(b_crit):
        return np.full_like(b, e_min_samples)
    return e_min_samples * (1.0 + b / b_crit)


@dataclass(frozen=True)
class McCandlishFit:
    """Fitted R(B) = E_min + S_min * B, i.e. E_min (1 + B / B_crit) with B_crit = E_min / S_min.

    Batch and B_crit are in the caller's batch unit (responses N = P*G for RL, tokens for
    pre-training); E_min in samples of that unit; S_min in optimizer steps.
    `unbounded`: the unconstrained slope was <= 0 (R does not grow with B: no large-batch penalty
    in the measured range), so the line is pinned flat, S_min = 0 and B_crit = inf.
    `cov`: covariance of (E_min, S_min) from the unconstrained fit, None when the data cannot give
    one (two points and no per-point sigma): then every interval is (0, inf).
    `dof`: degrees of freedom of the quantiles (inf = normal). `ci_method` says how `cov` was scaled.
    """

    e_min_samples: float
    b_crit: float
    b_crit_ci: tuple[float, float]
    e_min_ci: tuple[float, float]
    n_points: int
    residual_rms_rel: float
    unbounded: bool
    s_min_steps: float
    cov: Cov | None
    dof: float
    confidence: float
    ci_method: str

    def predict_samples(self, batch: ArrayLike) -> np.ndarray:
        """R(B) = E_min + S_min * B, in samples."""
        return self.e_min_samples + self.s_min_steps * np.asarray(batch, dtype=float)

    def predict_steps(self, batch: ArrayLike) -> np.ndarray:
        """S(B) = R(B) / B = S_min (1 + B_crit / B), in optimizer steps."""
        b = np.asarray(batch, dtype=float)
        return self.predict_samples(b) / b

    def predict_interval(self, batch: ArrayLike, confidence: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """Confidence band of the fitted line R(B) (not of one new seed's outcome), in samples.

        R +- q * sqrt(Var E_min + 2 B Cov + B^2 Var S_min), q a normal or t(dof) quantile,
        lower end clipped at 0. The covariance is the unconstrained fit's, so the band still widens
        with B when the line was pinned flat (`unbounded`). Without a covariance: (0, inf).
        """
        b = np.asarray(batch, dtype=float)
        pred = self.predict_samples(b)
        if self.cov is None:
            return np.zeros_like(pred), np.full_like(pred, math.inf)
        (c00, c01), (_, c11) = self.cov
        half = _quantile(confidence, self.dof) * np.sqrt(np.maximum(c00 + 2 * b * c01 + b * b * c11, 0.0))
        return np.maximum(pred - half, 0.0), pred + half

    def crossing_batch(self, reference_batch: float, tol: float) -> float:
        """The batch where R(B) / R(B0) = 1 + tol: B = B0 (1 + tol) + tol * B_crit (inf if unbounded).

        From (1 + B/B_crit) / (1 + B0/B_crit) = 1 + tol. Uses the model's R(B0), not a measured one.
        """
        if reference_batch <= 0 or tol < 0:
            raise AnalysisError(
                f"crossing_batch needs reference_batch > 0 and tol >= 0, got {reference_batch}, {tol}"
            )
        if self.unbounded:
            return math.inf
        return reference_batch * (1.0 + tol) + tol * self.b_crit


def _as_cov(c: np.ndarray) -> Cov:
    return ((float(c[0, 0]), float(c[0, 1])), (float(c[1, 0]), float(c[1, 1])))


def _quantile(confidence: float, dof: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise AnalysisError(f"confidence must lie in (0, 1), got {confidence}")
    p = (1.0 + confidence) / 2.0
    return float(stats.norm.ppf(p) if math.isinf(dof) else stats.t.ppf(p, dof))


def _wls(x: np.ndarray, y: np.ndarray, sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Weighted least squares y ~ x @ beta; returns beta, (X^T W X)^-1 and chi^2 of the residuals."""
    xw, yw = x / sigma[:, None], y / sigma
    beta, _, rank, _ = np.linalg.lstsq(xw, yw, rcond=None)
    if rank < x.shape[1]:
        raise AnalysisError("the least-squares fit is rank-deficient: measure distinct batches")
    cov = np.linalg.inv(xw.T @ xw)
    chi2 = float(np.sum((yw - xw @ beta) ** 2))
    if not (np.all(np.isfinite(beta)) and np.all(np.isfinite(cov)) and math.isfinite(chi2)):
        raise AnalysisError("the least-squares fit produced non-finite values; check the inputs")
    return beta, cov, chi2


def _check_points(batches: ArrayLike, values: ArrayLike, what: str) -> tuple[np.ndarray, ...]:
    b = np.asarray(batches, dtype=float)
    r = np.asarray(values, dtype=float)
    if b.ndim != 1 or b.shape != r.shape:
        raise AnalysisError(
            f"batches and {what} must be 1-D arrays of equal length, got {b.shape} and {r.shape}"
        )
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(r))):
        raise AnalysisError(
            f"batches and {what} must be finite (got NaN or inf); drop censored batches "
            "(R = inf) before fitting, they are not points on the curve"
        )
    if np.any(b <= 0) or np.any(r <= 0):
        raise AnalysisError(f"batches and {what} must be > 0")
    if np.unique(b).size < 2:
        raise AnalysisError(
            f"the fit needs at least two distinct batches with finite {what}, got "
            f"{np.unique(b).tolist()}; measure another batch size"
        )
    return b, r


def _resolve_sigma(r: np.ndarray, sigma: ArrayLike | None, weights: ArrayLike | None) -> np.ndarray | None:
    if sigma is not None and weights is not None:
        raise AnalysisError("pass sigma (per-point std) or weights (1/sigma^2), not both")
    if weights is not None:
        w = np.asarray(weights, dtype=float)
        if w.shape != r.shape or not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise AnalysisError("weights must be finite, > 0 and one per point")
        return 1.0 / np.sqrt(w)
    if sigma is not None:
        s = np.asarray(sigma, dtype=float)
        if s.shape != r.shape or not np.all(np.isfinite(s)) or np.any(s <= 0):
            raise AnalysisError("sigma must be finite, > 0 and one per point (std of R in samples)")
        return s
    return None


def _fit_line(
    b: np.ndarray, r: np.ndarray, sigma: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None, float, str]:
    """Fit r = a + s*b. Returns beta, the scaled covariance (or None), dof and the CI method."""
    x = np.column_stack([np.ones_like(b), b])
    n = b.size
    if sigma is not None:
        beta, cov, chi2 = _wls(x, r, sigma)
        red = chi2 / (n - 2) if n > 2 else 0.0
        if red > 1.0:  # the scatter exceeds the stated sigma: inflate, use t quantiles
            return beta, cov * red, float(n - 2), "sigma-inflated"
        return beta, cov, math.inf, "sigma"
    # Relative errors (multiplicative seed noise): sigma_i proportional to the fitted R_i (IRLS).
    sig = r.copy()
    beta = None  # type: ignore[assignment]
    for _ in range(_IRLS_MAX_ITER):
        new, cov, chi2 = _wls(x, r, sig)
        if beta is not None and np.allclose(new, beta, rtol=_IRLS_RTOL, atol=0.0):
            break
        beta = new
        pred = x @ beta
        sig = np.where(pred > 0, pred, r)
    else:
        raise AnalysisError(
            f"the relative-error fit did not converge in {_IRLS_MAX_ITER} iterations on "
            f"R={r.tolist()}; pass sigma per point"
        )
    if n <= 2:
        return new, None, math.inf, "none (two points, no sigma)"
    return new, cov * (chi2 / (n - 2)), float(n - 2), "residual"


def _draws(beta: np.ndarray, cov: np.ndarray, dof: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Parameter draws from N(beta, cov), or a multivariate t when dof is finite."""
    rng = np.random.default_rng(seed)
    w, v = np.linalg.eigh(cov)
    z = rng.standard_normal((_N_DRAWS, beta.size)) @ (v * np.sqrt(np.clip(w, 0.0, None))).T
    if math.isfinite(dof):
        z /= np.sqrt(rng.chisquare(dof, size=(_N_DRAWS, 1)) / dof)
    d = beta + z
    return d[:, 0], d[:, 1]


def _b_crit_of(a: np.ndarray, s: np.ndarray) -> np.ndarray:
    """B_crit = E_min / S_min with S_min <= 0 -> inf (unbounded) and E_min <= 0 -> 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(s > 0, a / s, math.inf)
    return np.where((s > 0) & (a <= 0), 0.0, out)


def fit_mccandlish(
    batches: ArrayLike,
    samples_to_target: ArrayLike,
    *,
    sigma: ArrayLike | None = None,
    weights: ArrayLike | None = None,
    confidence: float = 0.9,
    seed: int = 0,
) -> McCandlishFit:
    """Weighted least squares of R = E_min + S_min * B; B_crit = E_min / S_min.

    Errors: `sigma` (std of each R, samples) or `weights` (1/sigma^2) are taken as absolute, and
    the covariance is inflated by chi^2/dof when the scatter exceeds them. Without either, errors
    are relative (sigma_i proportional to the fitted R_i, iteratively reweighted) and the
    covariance is scaled by the residuals (needs >= 3 points; with 2 the intervals are (0, inf)).
    B_crit interval: percentiles of E_min/S_min over Monte Carlo draws of the fitted parameters
    (normal, or t with n-2 dof when residual-scaled); a draw with S_min <= 0 gives inf. We chose
    this over bootstrapping points: with 3-7 batches most point resamples are degenerate.
    Slope S_min <= 0: `unbounded`, the line is refitted flat (E_min = weighted mean of R).
    Intercept E_min <= 0 with a positive slope: AnalysisError (B_crit is below the smallest batch).
    """
    b, r = _check_points(batches, samples_to_target, "samples_to_target")
    _quantile(confidence, math.inf)  # validates confidence before any work
    given = _resolve_sigma(r, sigma, weights)
    beta, cov, dof, method = _fit_line(b, r, given)
    a, s = float(beta[0]), float(beta[1])
    unbounded = s <= 0
    if unbounded:
        # Pin what the data cannot identify: R does not grow with B -> flat line, B_crit = inf.
        # E_min = weighted mean of R (plain mean under relative errors, where sigma is constant).
        sig = given if given is not None else np.ones_like(r)
        flat, var_flat, chi2 = _wls(np.ones((b.size, 1)), r, sig)
        red = chi2 / (b.size - 1)
        if given is None or red > 1.0:
            var_flat = var_flat * red
        a, s, b_crit = float(flat[0]), 0.0, math.inf
        e_sd = math.sqrt(float(var_flat[0, 0]))
    elif a <= 0:
        raise AnalysisError(
            f"the fitted E_min is {a:.4g} <= 0: R grows in proportion to B over every measured "
            f"batch ({b.min():g}..{b.max():g}), so B_crit lies below the smallest one; measure "
            "smaller batches"
        )
    else:
        b_crit = a / s
        e_sd = math.sqrt(cov[0, 0]) if cov is not None else math.inf
    if cov is None:
        b_crit_ci, e_min_ci = (0.0, math.inf), (0.0, math.inf)
    else:
        qd = _quantile(confidence, dof)
        e_min_ci = (max(a - qd * e_sd, 0.0), a + qd * e_sd)
        lo, hi = percentile_interval(_b_crit_of(*_draws(beta, cov, dof, seed)), confidence)
        b_crit_ci = (min(lo, b_crit), max(hi, b_crit))
    pred = a + s * b
    rms = float(np.sqrt(np.mean(((r - pred) / pred) ** 2)))
    return McCandlishFit(
        e_min_samples=a,
        b_crit=b_crit,
        b_crit_ci=b_crit_ci,
        e_min_ci=e_min_ci,
        n_points=int(b.size),
        residual_rms_rel=rms,
        unbounded=unbounded,
        s_min_steps=s,
        cov=None if cov is None else _as_cov(cov),
        dof=dof,
        confidence=confidence,
        ci_method=method,
    )


def fit_steps_samples_line(
    steps: ArrayLike, samples: ArrayLike, *, confidence: float = 0.9, seed: int = 0
) -> McCandlishFit:
    """McCandlish's straight line across batches: 1/S = 1/S_min - B_crit * (1/E).

    Each point is one batch's steps-to-target S and samples-to-target E (B = E / S). Fitted with
    relative errors like `fit_mccandlish` (intercept c = 1/S_min, slope m = -B_crit), then mapped
    to E_min = -m/c, S_min = 1/c with a delta-method covariance for `predict_interval`; the B_crit
    and E_min intervals come from Monte Carlo draws of (c, m). This form cannot represent "no
    large-batch penalty" (the points then stack on a vertical line), so c <= 0 or m >= 0 raises:
    use `fit_mccandlish` on R(B), the primary fit.
    """
    s_arr, e_arr = _check_points(steps, samples, "samples")
    _check_points(e_arr / s_arr, e_arr, "samples")  # needs two distinct batches B = E / S
    if np.unique(e_arr).size < 2:
        raise AnalysisError(
            "every batch used the same samples-to-target (perfect scaling): the line 1/S vs 1/E "
            "is vertical; fit R(B) with fit_mccandlish, which reports B_crit unbounded"
        )
    beta, cov, dof, method = _fit_line(1.0 / e_arr, 1.0 / s_arr, None)
    c, m = float(beta[0]), float(beta[1])
    if c <= 0 or m >= 0:
        raise AnalysisError(
            f"the line 1/S = {c:.4g} + {m:.4g}/E has no physical reading (needs intercept > 0 and "
            "slope < 0); fit R(B) with fit_mccandlish instead"
        )
    b_crit, s_min = -m, 1.0 / c
    e_min = b_crit * s_min
    b = e_arr / s_arr
    pred = e_min + s_min * b
    if cov is None:
        b_crit_ci, e_min_ci, cov_ab = (0.0, math.inf), (0.0, math.inf), None
    else:
        cd, md = _draws(beta, cov, dof, seed)
        with np.errstate(divide="ignore", invalid="ignore"):
            e_draws = np.where(cd > 0, np.maximum(-md, 0.0) / cd, math.inf)
        lo, hi = percentile_interval(np.maximum(-md, 0.0), confidence)
        b_crit_ci = (min(lo, b_crit), max(hi, b_crit))
        lo, hi = percentile_interval(e_draws, confidence)
        e_min_ci = (min(lo, e_min), max(hi, e_min))
        jac = np.array([[m / c**2, -1.0 / c], [-1.0 / c**2, 0.0]])  # d(E_min, S_min)/d(c, m)
        j = jac @ cov @ jac.T
        cov_ab = _as_cov(j)
    return McCandlishFit(
        e_min_samples=e_min,
        b_crit=b_crit,
        b_crit_ci=b_crit_ci,
        e_min_ci=e_min_ci,
        n_points=int(b.size),
        residual_rms_rel=float(np.sqrt(np.mean(((e_arr - pred) / pred) ** 2))),
        unbounded=False,
        s_min_steps=s_min,
        cov=cov_ab,
        dof=dof,
        confidence=confidence,
        ci_method=method,
    )


def pollux_efficiency(batch: ArrayLike, b_noise: float, b0: float) -> np.ndarray:
    """Statistical efficiency of batch B relative to B0: (B_noise + B0) / (B_noise + B).

    Pollux / AdaptDL (Qiao et al. 2021, goodput.py). Equals R(B0) / R(B) of the McCandlish model
    with B_crit = B_noise; B_noise = inf gives 1 (perfect scaling).
    """
    b = np.asarray(batch, dtype=float)
    if math.isnan(b_noise) or b_noise < 0 or not (math.isfinite(b0) and b0 > 0):
        raise AnalysisError(f"need b_noise >= 0 and finite b0 > 0, got {b_noise}, {b0}")
    if not np.all(np.isfinite(b)) or np.any(b <= 0):
        raise AnalysisError("batch sizes must be finite and > 0")
    if math.isinf(b_noise):
        return np.ones_like(b)
    return (b_noise + b0) / (b_noise + b)
