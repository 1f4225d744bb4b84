"""The critical training batch: the largest batch whose curve still overlays the reference.

METHOD §3.2, operational form: R(B) / R(B0) <= 1 + tol (tol ~ 0.1), judged against the seed-to-seed
spread. R is samples-to-target (curves.py); B is in the caller's unit (responses N = P*G for RL,
tokens for pre-training). Sources: McCandlish et al. 2018 (the R(B) model used for
`interpolated`); Merrill et al. 2025 (branches "match" within a tolerance of the smaller batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from batchtune.analysis.curves import TargetEstimate, bootstrap_medians, percentile_interval
from batchtune.analysis.scaling import McCandlishFit, fit_mccandlish
from batchtune.errors import AnalysisError

REFERENCE = "reference"
INVARIANT = "invariant"
DEVIATES = "deviates"
INCONCLUSIVE = "inconclusive"
STATUSES = (REFERENCE, INVARIANT, DEVIATES, INCONCLUSIVE)


@dataclass(frozen=True)
class RatioEstimate:
    """R(B) / R(B0) with an interval (dimensionless); inf when the candidate never reached."""

    ratio: float
    ci_low: float
    ci_high: float

    def __post_init__(self) -> None:
        vals = (self.ratio, self.ci_low, self.ci_high)
        if any(math.isnan(v) for v in vals) or not 0 <= self.ci_low <= self.ratio <= self.ci_high:
            raise AnalysisError(f"a RatioEstimate needs 0 <= ci_low <= ratio <= ci_high, got {vals}")

    @property
    def degenerate(self) -> bool:
        """True when the interval has no width: no seed spread was available on either side."""
        return self.ci_low == self.ci_high


@dataclass(frozen=True)
class Verdict:
    """One batch compared with the reference: status is one of STATUSES, reason is one line."""

    batch: float
    status: str
    ratio: RatioEstimate | None
    reason: str


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.2f}"


def _divide(num: np.ndarray, den: np.ndarray, nan_as: float) -> np.ndarray:
    """num / den with x/inf = 0, inf/x = inf, x/0 = inf, and inf/inf (unknown) -> `nan_as`."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.asarray(num, dtype=float) / np.asarray(den, dtype=float)
    out = np.where((den == 0) & (num > 0), math.inf, out)
    return np.where(np.isnan(out), nan_as, out)


def ratio_to_reference(
    ref: TargetEstimate,
    cand: TargetEstimate,
    *,
    confidence: float = 0.9,
    n_boot: int = 2000,
    seed: int = 0,
) -> RatioEstimate:
    """R(B)/R(B0): ratio of the two medians; interval by independent bootstrap over each's seeds.

    Each bootstrap draw is median(resampled cand seeds) / median(resampled ref seeds), censored
    seeds as inf. A draw of inf/inf says nothing, so it counts as 0 for the lower percentile and
    inf for the upper (the interval widens rather than guesses). When either side has one seed,
    the interval comes from the estimates' own intervals: [cand.ci_low / ref.ci_high,
    cand.ci_high / ref.ci_low]. The interval is widened to contain the point if needed.
    A reference that never reached the target (R0 = inf) gives no ratio: AnalysisError.
    """
    if not 0.0 < confidence < 1.0:
        raise AnalysisError(f"confidence must lie in (0, 1), got {confidence}")
    if math.isinf(ref.samples_to_target):
        raise AnalysisError(
            f"the reference never reached the target in {ref.n_censored} of {ref.n_seeds} seeds "
            "(R0 = inf), so no ratio to it exists; lower the target or choose a reference batch "
            "that reaches it"
        )
    point = float(_divide(np.array(cand.samples_to_target), np.array(ref.samples_to_target), 0))
    if ref.has_spread and cand.has_spread:
        rng = np.random.default_rng(seed)
        mr = bootstrap_medians(ref.seed_values(), n_boot, rng)
        mc = bootstrap_medians(cand.seed_values(), n_boot, rng)
        lo, _ = percentile_interval(_divide(mc, mr, 0.0), confidence)
        _, hi = percentile_interval(_divide(mc, mr, math.inf), confidence)
    else:
        lo = float(_divide(np.array(cand.ci_low), np.array(ref.ci_high), 0.0))
        hi = float(_divide(np.array(cand.ci_high), np.array(ref.ci_low), math.inf))
    return RatioEstimate(ratio=point, ci_low=min(lo, point), ci_high=max(hi, point))


def classify(ratio: RatioEstimate, *, tol: float = 0.1) -> tuple[str, str]:
    """Status of one batch from its R/R0 interval, with a one-line reason.

    invariant:    ci_high <= 1 + tol  (the whole interval is within tolerance)
    deviates:     ci_low  >  1 + tol  (the whole interval is beyond it)
    inconclusive: otherwise (the interval straddles 1 + tol: more seeds would decide)
    With a degenerate interval (ci_low == ci_high: no seed spread on either side) the point
    decides: invariant if ratio <= 1 + tol, else deviates, and the reason says so.
    """
    if math.isnan(tol) or tol < 0:
        raise AnalysisError(f"tol must be >= 0, got {tol}; 0.1 is the usual choice")
    thr = 1.0 + tol
    shown = f"R/R0 = {_fmt(ratio.ratio)} [{_fmt(ratio.ci_low)}, {_fmt(ratio.ci_high)}]"
    if ratio.degenerate:
        status = INVARIANT if ratio.ratio <= thr else DEVIATES
        side = "within" if status == INVARIANT else "above"
        return status, (
            f"R/R0 = {_fmt(ratio.ratio)} {side} 1+tol={thr:.2f} "
            "(no seed spread available: decided on the point estimate)"
        )
    if ratio.ci_high <= thr:
        return INVARIANT, f"{shown} within 1+tol={thr:.2f}"
    if ratio.ci_low > thr:
        return DEVIATES, f"{shown} above 1+tol={thr:.2f}"
    return INCONCLUSIVE, f"{shown} straddles 1+tol={thr:.2f}: more seeds would decide"


@dataclass(frozen=True)
class CriticalBatch:
    """The critical training batch from measured batches, with its bracket and a model estimate.

    Rule (walk up from the reference B0 in increasing batch order):
      - "invariant": the batch becomes the critical batch and the walk goes on;
      - "inconclusive" with point ratio <= 1 + tol: passed over (not adopted), the walk goes on;
      - "deviates", or "inconclusive" with point ratio > 1 + tol: the walk stops.
    `batch`: the last adopted batch, or B0 itself when none above it was shown invariant (B0
    trivially overlays itself). None only when the reference never reached the target.
    `lower` = `batch`; `upper`: the smallest "deviates" batch above it, None when none deviates
    ("at least `lower`"). `interpolated`: where the McCandlish fit crosses R/R0 = 1 + tol
    (None when the fit failed or shows no large-batch penalty; `reason` says which).
    `verdicts[i]` is for `batches[i]` (input order). Batches below a non-smallest reference get
    verdicts but take no part in the walk. `fit` is the McCandlish fit behind `interpolated`.
    """

    batch: float | None
    lower: float | None
    upper: float | None
    interpolated: float | None
    verdicts: tuple[Verdict, ...]
    tol: float
    reason: str
    reference_batch: float
    fit: McCandlishFit | None


def _model_crossing(
    batches: np.ndarray, estimates: Sequence[TargetEstimate], b0: float, tol: float, conf: float
) -> tuple[float | None, McCandlishFit | None, str]:
    """Fit R(B) on the finite points and solve R(B)/R(B0) = 1 + tol; never raises."""
    finite = [i for i, e in enumerate(estimates) if math.isfinite(e.samples_to_target)]
    if len({batches[i] for i in finite}) < 2:
        return None, None, "no model estimate (fewer than two batches reached the target)"
    b = batches[finite]
    r = np.array([estimates[i].samples_to_target for i in finite])
    lo = np.array([estimates[i].ci_low for i in finite])
    hi = np.array([estimates[i].ci_high for i in finite])
    # Seed spread as absolute sigma when every point has one; otherwise relative errors.
    sigma = None
    if all(estimates[i].has_spread for i in finite) and np.all(np.isfinite(hi)):
        sigma = (hi - lo) / (2.0 * float(stats.norm.ppf((1.0 + conf) / 2.0)))
        if np.any(sigma <= 0):
            sigma = None
    try:
        fit = fit_mccandlish(b, r, sigma=sigma, confidence=conf)
    except AnalysisError as err:
        return None, None, f"model fit failed ({err})"
    if fit.unbounded:
        return None, fit, "model shows no large-batch penalty (B_crit unbounded)"
    cross = fit.crossing_batch(b0, tol)
    where = "extrapolated beyond" if cross > batches.max() else "within"
    why = f"model B_crit = {fit.b_crit:.4g} crosses 1+tol at B = {cross:.4g} ({where} the range)"
    return cross, fit, why


def critical_batch(
    batches: Sequence[float],
    estimates: Sequence[TargetEstimate],
    *,
    reference_index: int | None = None,
    tol: float = 0.1,
    confidence: float = 0.9,
    seed: int = 0,
) -> CriticalBatch:
    """Verdict for every batch against the reference, the critical batch, its bracket, the model.

    `reference_index` defaults to the smallest batch. See CriticalBatch for the exact rule.
    """
    b = np.asarray(batches, dtype=float)
    if b.ndim != 1 or b.size != len(estimates):
        raise AnalysisError(
            f"need one TargetEstimate per batch, got {b.size} batches and {len(estimates)} estimates"
        )
    if b.size < 2:
        raise AnalysisError("a critical batch needs a reference and at least one larger batch")
    if not np.all(np.isfinite(b)) or np.any(b <= 0):
        raise AnalysisError(f"batches must be finite and > 0, got {b.tolist()}")
    if np.unique(b).size != b.size:
        raise AnalysisError(
            f"each batch must appear once, got {b.tolist()}; merge the seeds of repeated batches"
        )
    if math.isnan(tol) or tol < 0:
        raise AnalysisError(f"tol must be >= 0, got {tol}; 0.1 is the usual choice")
    ref_i = int(np.argmin(b)) if reference_index is None else reference_index
    if not 0 <= ref_i < b.size:
        raise AnalysisError(f"reference_index {reference_index} is out of range for {b.size} batches")
    ref, b0 = estimates[ref_i], float(b[ref_i])
    order = np.argsort(b)

    if math.isinf(ref.samples_to_target):
        why = f"reference batch {b0:g} never reached the target (R0 = inf)"
        verdicts = tuple(
            Verdict(float(b[i]), REFERENCE if i == ref_i else INCONCLUSIVE, None, why) for i in range(b.size)
        )
        return CriticalBatch(
            batch=None,
            lower=None,
            upper=None,
            interpolated=None,
            verdicts=verdicts,
            tol=tol,
            reason=why + "; lower the target or choose another reference",
            reference_batch=b0,
            fit=None,
        )

    verdicts: list[Verdict] = []
    for i in range(b.size):
        if i == ref_i:
            verdicts.append(Verdict(b0, REFERENCE, None, "reference batch"))
            continue
        ratio = ratio_to_reference(ref, estimates[i], confidence=confidence, seed=seed + int(i))
        status, why = classify(ratio, tol=tol)
        verdicts.append(Verdict(float(b[i]), status, ratio, why))

    ascending = [verdicts[i] for i in order]
    crit, stop, passed = b0, None, []
    for v in ascending:
        if v.batch <= b0:
            continue
        if v.status == INVARIANT:
            crit = v.batch
        elif v.status == INCONCLUSIVE and v.ratio is not None and v.ratio.ratio <= 1.0 + tol:
            passed.append(v.batch)
        else:
            stop = v
            break
    upper = next((v.batch for v in ascending if v.batch > crit and v.status == DEVIATES), None)

    parts = [f"critical batch {crit:g}" + (" (the reference)" if crit == b0 else "")]
    if upper is None:
        parts.append(f"no measured batch deviates: at least {crit:g}")
    else:
        parts.append(f"first deviating batch above it: {upper:g}")
    if passed:
        shown = ", ".join(f"{x:g}" for x in passed)
        parts.append(f"inconclusive but within tolerance on the point: {shown}")
    if stop is not None and stop.status == INCONCLUSIVE:
        parts.append(f"walk stopped at {stop.batch:g} (inconclusive, point above 1+tol)")
    later = [v.batch for v in ascending if v.batch > crit and v.status == INVARIANT]
    if later:
        shown = ", ".join(f"{x:g}" for x in later)
        parts.append(f"larger batches {shown} test invariant again: noisy data, add seeds")
    interpolated, fit, model_why = _model_crossing(b, estimates, b0, tol, confidence)
    parts.append(model_why)
    if interpolated is not None and not crit <= interpolated <= (upper or math.inf):
        parts.append("the model disagrees with the measured bracket: trust the measurements")
    return CriticalBatch(
        batch=crit,
        lower=crit,
        upper=upper,
        interpolated=interpolated,
        verdicts=tuple(verdicts),
        tol=tol,
        reason="; ".join(parts),
        reference_batch=b0,
        fit=fit,
    )
