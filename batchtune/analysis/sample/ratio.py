"""One batch against the reference: R(B)/R(B0) with an interval, and its verdict.

Operational form of the invariance test (docs/method.md §3.2): R(B)/R(B0) <= 1 + tol (tol ~ 0.1),
judged against the seed-to-seed spread. Seeds are paired when their ids match (the same seed at
every batch shares the sample stream): the interval is a t interval on the paired log ratios
(Welch's when unpaired), and a paired seed bootstrap when some seeds never reached the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from batchtune.analysis.sample.seeds import TargetEstimate, bootstrap_medians, percentile_interval
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
