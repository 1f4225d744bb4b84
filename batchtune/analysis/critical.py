"""The critical training batch: the largest batch whose curve still overlays the reference.

docs/method.md §3.2, operational form: R(B) / R(B0) <= 1 + tol (tol ~ 0.1), judged against the seed-to-seed
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
from batchtune.analysis.joint import JointFit, fit_joint
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


def _log_ratio_interval(
    ref: TargetEstimate, cand: TargetEstimate, confidence: float
) -> tuple[float, ...] | None:
    """exp of a t interval of the mean log ratio: paired over common seeds, else Welch; None if n/a.

    Paired (seeds shared, >= 2 of them, none censored): d_i = log R_i(B) - log R_i(B0),
        ratio = exp(mean d), interval exp(mean d +- t_{n-1} sd(d) / sqrt(n)).
    Unpaired (no seed ids in common, >= 2 uncensored seeds each, none censored): Welch's t on
    log R with Welch-Satterthwaite degrees of freedom. Exact coverage for log-normal seed noise
    (Student 1908; Welch 1947), which a bootstrap of 3 seeds (10 distinct resamples) is not.
    """
    q = (1.0 + confidence) / 2.0
    if ref.n_censored or cand.n_censored:
        return None
    common = sorted(set(ref.seed_ids) & set(cand.seed_ids))
    if len(common) >= 2:
        r0 = dict(zip(ref.seed_ids, ref.per_seed, strict=True))
        r1 = dict(zip(cand.seed_ids, cand.per_seed, strict=True))
        d = np.log([r1[i] / r0[i] for i in common])  # type: ignore[operator]
        half = float(stats.t.ppf(q, d.size - 1)) * float(np.std(d, ddof=1)) / math.sqrt(d.size)
        m = float(np.mean(d))
        return math.exp(m), math.exp(m - half), math.exp(m + half)
    if common or not (ref.has_spread and cand.has_spread):
        return None
    a, c = np.log(ref.seed_values()), np.log(cand.seed_values())
    va, vc = np.var(a, ddof=1) / a.size, np.var(c, ddof=1) / c.size
    if va + vc <= 0:
        return None
    dof = (va + vc) ** 2 / (va**2 / (a.size - 1) + vc**2 / (c.size - 1))
    m = float(np.mean(c) - np.mean(a))
    half = float(stats.t.ppf(q, dof)) * math.sqrt(va + vc)
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def ratio_to_reference(
    ref: TargetEstimate,
    cand: TargetEstimate,
    *,
    confidence: float = 0.9,
    n_boot: int = 2000,
    seed: int = 0,
) -> RatioEstimate:
    """R(B)/R(B0) with an interval of stated coverage, pairing seeds when their ids match.

    Every seed reached the target on both sides: the geometric-mean ratio with a t interval of
    the log ratios, paired over common seed ids (a seed's luck cancels), else Welch's unpaired t
    (`_log_ratio_interval`); its coverage is checked by simulation in tests/analysis.
    With censored seeds (R = inf): ratio of medians, interval by bootstrap over seeds, resampling
    common seed ids jointly when there are any; inf/inf draws count as 0 for the lower percentile
    and inf for the upper (the interval widens rather than guesses). When either side has one
    seed: [cand.ci_low / ref.ci_high, cand.ci_high / ref.ci_low]. The interval always contains
    the point. A reference that never reached the target (R0 = inf) gives no ratio: AnalysisError.
    """
    if not 0.0 < confidence < 1.0:
        raise AnalysisError(f"confidence must lie in (0, 1), got {confidence}")
    if math.isinf(ref.samples_to_target):
        raise AnalysisError(
            f"the reference never reached the target in {ref.n_censored} of {ref.n_seeds} seeds "
            "(R0 = inf), so no ratio to it exists; lower the target or choose a reference batch "
            "that reaches it"
        )
    t_based = _log_ratio_interval(ref, cand, confidence)
    if t_based is not None:
        point, lo, hi = t_based
        return RatioEstimate(ratio=point, ci_low=min(lo, point), ci_high=max(hi, point))
    point = float(_divide(np.array(cand.samples_to_target), np.array(ref.samples_to_target), 0))
    common = sorted(set(ref.seed_ids) & set(cand.seed_ids))
    rng = np.random.default_rng(seed)
    if len(common) >= 2:
        v0 = dict(zip(ref.seed_ids, ref.seed_values(), strict=True))
        v1 = dict(zip(cand.seed_ids, cand.seed_values(), strict=True))
        idx = rng.integers(0, len(common), size=(n_boot, len(common)))
        mr = np.median(np.array([v0[i] for i in common])[idx], axis=1)
        mc = np.median(np.array([v1[i] for i in common])[idx], axis=1)
    elif ref.has_spread and cand.has_spread:
        mr = bootstrap_medians(ref.seed_values(), n_boot, rng)
        mc = bootstrap_medians(cand.seed_values(), n_boot, rng)
    else:
        lo = float(_divide(np.array(cand.ci_low), np.array(ref.ci_high), 0.0))
        hi = float(_divide(np.array(cand.ci_high), np.array(ref.ci_low), math.inf))
        return RatioEstimate(ratio=point, ci_low=min(lo, point), ci_high=max(hi, point))
    lo, _ = percentile_interval(_divide(mc, mr, 0.0), confidence)
    _, hi = percentile_interval(_divide(mc, mr, math.inf), confidence)
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
    """The critical training batch: a joint estimate with an interval, and per-batch evidence.

    Estimate (`joint.fit_joint` over every run that reached the target, seeds paired): `crossing`
    is where the chosen fit of R(B)/R(B0) reaches 1 + tol, `crossing_ci` its profile interval at
    `joint.confidence`; `batch` is the largest measured batch at or below the crossing and below
    `failed_from` (the smallest batch that diverged, ran out of memory or never reached the
    target in every seed: an upper bound, the critical batch is below it). `lower` / `upper`:
    the largest measured batch below the interval (at least B0) and the smallest measured batch
    above it (or `failed_from`; None when none: "at least"). `interpolated` = `crossing`.
    Without a joint fit (too few runs: `joint` None, `reason` says why) the walk decides:
    `walk_batch` is the last batch adopted walking up from B0 through "invariant" verdicts
    (passing over inconclusive ones whose point is within 1 + tol, stopping at the first other),
    a lower bound kept as evidence. `verdicts[i]` is for `batches[i]` (input order). `fit`: the
    per-point McCandlish least-squares fit of the seed medians (`scaling.fit_mccandlish`).
    `batch` is None only when the reference never reached the target.
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
    crossing: float | None = None
    crossing_ci: tuple[float, float] | None = None
    joint: JointFit | None = None
    failed_from: float | None = None
    walk_batch: float | None = None


def _model_crossing(
    batches: np.ndarray, estimates: Sequence[TargetEstimate], conf: float
) -> McCandlishFit | None:
    """The per-point McCandlish fit of the finite medians, or None when it cannot be made."""
    finite = [i for i, e in enumerate(estimates) if math.isfinite(e.samples_to_target)]
    if len({batches[i] for i in finite}) < 2:
        return None
    b = batches[finite]
    r = np.array([estimates[i].samples_to_target for i in finite])
    try:
        return fit_mccandlish(b, r, confidence=conf)
    except AnalysisError:
        return None


def _walk(ascending: list[Verdict], b0: float, tol: float) -> tuple[float, float | None, list[str]]:
    """The walk up from B0 (see CriticalBatch): adopted batch, first deviating above it, notes."""
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
    notes = []
    if passed:
        notes.append("inconclusive but within tolerance on the point: " + ", ".join(f"{x:g}" for x in passed))
    if stop is not None and stop.status == INCONCLUSIVE:
        notes.append(f"walk stopped at {stop.batch:g} (inconclusive, point above 1+tol)")
    return crit, upper, notes


def _respect_verdicts(
    ascending: list[Verdict],
    measured: np.ndarray,
    crit: float,
    lower: float,
    upper: float | None,
    b0: float,
) -> tuple[float, float, float | None, str]:
    """Keep the fit's answer inside the measured bracket: the model never overrules measured points.

    A batch whose whole ratio interval is within 1 + tol ("invariant") is at or below the critical
    batch; one whose whole interval is above ("deviates") is above it. When they agree with each
    other, the estimate is moved into [largest invariant, smallest deviating) and `lower` / `upper`
    are tightened to them; when they conflict (noise), the fit decides.
    """
    inv = [v.batch for v in ascending if v.status == INVARIANT and v.batch in measured]
    dev = [v.batch for v in ascending if v.status == DEVIATES]
    lo_ev, hi_ev = max(inv, default=b0), min(dev, default=math.inf)
    if lo_ev >= hi_ev:
        return crit, lower, upper, ""
    below = measured[measured < hi_ev]
    new = float(min(max(crit, lo_ev), below.max()))
    lower = max(lower, lo_ev)
    upper = hi_ev if upper is None or hi_ev < upper else upper
    if upper is not None and upper <= new:  # the fit's interval ended below a measured invariant
        above = measured[measured > new]
        upper = hi_ev if math.isfinite(hi_ev) else (float(above.min()) if above.size else None)
    if upper is not None and math.isinf(upper):
        upper = None
    why = "" if new == crit else f"the fit alone says {crit:g}; the measured verdicts bracket it at {new:g}"
    return new, min(lower, new), upper, why


def _joint_runs(
    b: np.ndarray, estimates: Sequence[TargetEstimate], usable: np.ndarray
) -> tuple[list[float], list[float], list[int] | None]:
    """One (batch, R, seed id) per uncensored run of the usable batches; ids None if any unknown."""
    bb: list[float] = []
    rr: list[float] = []
    ss: list[int] = []
    known = all(estimates[i].seed_ids for i in range(b.size) if usable[i])
    for i in np.flatnonzero(usable):
        e = estimates[int(i)]
        for k, v in enumerate(e.per_seed):
            if v is not None and v > 0:
                bb.append(float(b[i]))
                rr.append(float(v))
                ss.append(e.seed_ids[k] if known else len(ss))
    return bb, rr, ss if known else None


def critical_batch(
    batches: Sequence[float],
    estimates: Sequence[TargetEstimate],
    *,
    reference_index: int | None = None,
    tol: float = 0.1,
    confidence: float = 0.9,
    seed: int = 0,
    failed_batches: Sequence[float] = (),
) -> CriticalBatch:
    """Verdict for every batch against the reference, the joint estimate and its interval.

    `reference_index` defaults to the smallest batch. `failed_batches`: batches with no usable run
    (every seed diverged or ran out of memory); with batches whose seeds mostly never reached
    the target (R = inf) they bound the critical batch from above. See CriticalBatch.
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
        return CriticalBatch(
            batch=None,
            lower=None,
            upper=None,
            interpolated=None,
            verdicts=tuple(
                Verdict(float(b[i]), REFERENCE if i == ref_i else INCONCLUSIVE, None, why)
                for i in range(b.size)
            ),
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
    walk, walk_upper, notes = _walk(ascending, b0, tol)
    never = [float(b[i]) for i in range(b.size) if math.isinf(estimates[i].samples_to_target)]
    failed_from = min([*never, *(float(x) for x in failed_batches)], default=None)
    usable = np.array([math.isfinite(e.samples_to_target) for e in estimates]) & (
        b < (failed_from if failed_from is not None else math.inf)
    )
    joint = None
    try:
        joint = fit_joint(
            *_joint_runs(b, estimates, usable), reference_batch=b0, tol=tol, confidence=confidence
        )
    except AnalysisError as err:
        notes.insert(0, f"no joint fit ({err}): the walk decides")
    fit = _model_crossing(b, estimates, confidence)
    measured = np.sort(b[usable])
    if joint is None:
        crit, lower, upper, cross, cross_ci = walk, walk, walk_upper, None, None
        head = f"critical batch {crit:g}" + (" (the reference)" if crit == b0 else "") + " by the walk"
    else:
        best = joint.best
        cross, cross_ci = best.crossing, best.crossing_ci
        crit = float(measured[measured <= cross].max())
        lower = float(max(measured[measured <= cross_ci[0]].max(initial=b0), b0))
        above = measured[measured > cross_ci[1]]
        upper = float(above.min()) if above.size else failed_from
        crit, lower, upper, clamp = _respect_verdicts(ascending, measured, crit, lower, upper, b0)
        head = f"critical batch {crit:g}" + (" (the reference)" if crit == b0 else "")
        head += f": {joint.describe()}"
        if clamp:
            notes.insert(0, clamp)
        if crit != walk:
            notes.append(f"the verdict walk alone would say {walk:g} (a lower bound)")
    parts = [head]
    if failed_from is not None:
        parts.append(
            f"every seed failed or never reached the target from {failed_from:g}: "
            "the critical batch is below it"
        )
    elif upper is None:
        parts.append(f"no measured batch is above the interval: at least {crit:g}")
    later = [v.batch for v in ascending if v.batch > walk and v.status == INVARIANT]
    if later:
        shown = ", ".join(f"{x:g}" for x in later)
        parts.append(f"larger batches {shown} test invariant again: noisy data, add seeds")
    parts.extend(notes)
    return CriticalBatch(
        batch=crit,
        lower=lower,
        upper=upper,
        interpolated=cross,
        verdicts=tuple(verdicts),
        tol=tol,
        reason="; ".join(parts),
        reference_batch=b0,
        fit=fit,
        crossing=cross,
        crossing_ci=cross_ci,
        joint=joint,
        failed_from=failed_from,
        walk_batch=walk,
    )
