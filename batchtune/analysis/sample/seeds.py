"""Samples-to-target over seeds: the median (or geometric mean) of the seeds' crossings with a
bootstrap percentile interval, censored seeds counted as later than anything observed; and an R a
user gives (docs/method.md §3). One run's crossing is ``curves.py``'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchtune.analysis.sample.curves import TargetCrossing
from batchtune.errors import AnalysisError

MEDIAN, GEOMETRIC_MEAN = "median", "geometric mean"  # TargetEstimate.statistic


@dataclass(frozen=True)
class TargetEstimate:
    """Samples-to-target R over seeds: median with a bootstrap percentile interval.

    Censored seeds count as +inf (later than anything observed), so `samples_to_target` is finite
    while fewer than half the seeds are censored and math.inf otherwise ("never reached").
    `per_seed[i]` is seed i's R (None if censored); `censored_at[i]` its bound (None if not).
    With one seed `ci_low == ci_high == samples_to_target`: there is no spread estimate
    (`has_spread` is False) and downstream decisions fall back to the point.
    """

    samples_to_target: float
    ci_low: float
    ci_high: float
    n_seeds: int
    n_censored: int
    per_seed: tuple[float | None, ...]
    censored_at: tuple[float | None, ...]
    confidence: float
    seed_ids: tuple[int, ...] = ()  # the run seed of each entry; () when unknown (no pairing)
    statistic: str = MEDIAN  # over seeds: MEDIAN or GEOMETRIC_MEAN (estimate_over_seeds)

    def __post_init__(self) -> None:
        vals = (self.samples_to_target, self.ci_low, self.ci_high)
        if any(math.isnan(v) for v in vals) or not (
            0 <= self.ci_low <= self.samples_to_target <= self.ci_high
        ):
            raise AnalysisError(
                f"a TargetEstimate needs 0 <= ci_low <= samples_to_target <= ci_high, got "
                f"{self.ci_low} <= {self.samples_to_target} <= {self.ci_high}"
            )
        if not (self.n_seeds >= 1 and 0 <= self.n_censored <= self.n_seeds):
            raise AnalysisError(f"bad seed counts: n_seeds={self.n_seeds}, n_censored={self.n_censored}")
        if len(self.per_seed) != self.n_seeds or len(self.censored_at) != self.n_seeds:
            raise AnalysisError("per_seed and censored_at must have one entry per seed")
        if self.seed_ids and (len(self.seed_ids) != self.n_seeds or len(set(self.seed_ids)) != self.n_seeds):
            raise AnalysisError(f"seed_ids must be empty or one distinct id per seed, got {self.seed_ids}")
        if not 0.0 < self.confidence < 1.0:
            raise AnalysisError(f"confidence must lie in (0, 1), got {self.confidence}")

    @property
    def has_spread(self) -> bool:
        """True when two or more seeds were measured, so the interval reflects seed-to-seed spread."""
        return self.n_seeds >= 2

    @property
    def no_interval(self) -> bool:
        """True for one seed and no interval given with it (estimate_from_value without a ci): the
        point is all there is, and reports say so instead of printing a zero-width interval."""
        return self.n_seeds == 1 and self.ci_low == self.ci_high

    def seed_values(self) -> np.ndarray:
        """Per-seed R with censored seeds as +inf (the convention the median and bootstrap use)."""
        return np.array([math.inf if v is None else v for v in self.per_seed], dtype=float)


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise AnalysisError(f"confidence must lie in (0, 1), got {confidence}; 0.9 is the default")


def bootstrap_medians(values: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of `n_boot` resamples (with replacement) of `values`; +inf entries are allowed."""
    if n_boot < 1:
        raise AnalysisError(f"n_boot must be >= 1, got {n_boot}; 2000 is the default")
    idx = rng.integers(0, values.size, size=(n_boot, values.size))
    return np.median(values[idx], axis=1)


def percentile_interval(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    """Equal-tailed percentile interval; uses order statistics so +inf draws stay +inf (no NaN)."""
    lo, hi = np.quantile(draws, [(1 - confidence) / 2, (1 + confidence) / 2], method="inverted_cdf")
    return float(lo), float(hi)


def estimate_over_seeds(
    crossings: Sequence[TargetCrossing],
    *,
    confidence: float = 0.9,
    n_boot: int = 2000,
    seed: int = 0,
    seed_ids: Sequence[int] | None = None,
    statistic: str = MEDIAN,
) -> TargetEstimate:
    """Median R over seeds (censored = +inf) with a percentile bootstrap CI over seeds; or, with
    ``statistic = GEOMETRIC_MEAN``, the geometric mean (below).

    `seed_ids[i]` is the run seed of `crossings[i]`: runs with one seed id at different batches
    share the sample stream, so ratios and the joint fit pair them (critical.py, joint.py).
    The median's interval is descriptive: with 3 seeds it is [min, max], a 75% interval. The
    decisions use the paired ratio interval of `critical.ratio_to_reference` instead.

    Point: median_i R_i. CI: the (1-c)/2 and (1+c)/2 quantiles of medians of seeds resampled with
    replacement; censored draws stay +inf, so `ci_high` may be inf. One seed: CI = the point.
    All seeds censored: R = inf (data: "never reached"), not an error.

    GEOMETRIC_MEAN: for seeds that sample a cost a run pays many times over (a branched probe's
    local ratios: a fixed-batch run crosses one window after another), where the median hides a
    heavy right tail: at the edge of stability a third of a batch's branches keep up and the rest
    fall far behind or never reach the level, and the median of a few seeds can read the ones that
    keep up. A censored seed counts at its bound, so with one the point is a lower bound; the
    bootstrap interval's low end counts censored seeds at their bounds, its high end at +inf (one
    censored seed opens it). Geometric, not arithmetic: the seeds' noise is multiplicative (a ratio
    of two crossings), and the arithmetic mean of noisy ratios is biased up by it. All seeds
    censored: inf, as the median gives.
    """
    _check_confidence(confidence)
    if statistic not in (MEDIAN, GEOMETRIC_MEAN):
        raise AnalysisError(f"statistic must be {MEDIAN!r} or {GEOMETRIC_MEAN!r}, got {statistic!r}")
    crossings = list(crossings)
    if not crossings:
        raise AnalysisError(
            "no target crossings to estimate from: run at least one seed (three or more give a "
            "seed-to-seed spread)"
        )
    for c in crossings:
        if not isinstance(c, TargetCrossing):
            raise AnalysisError(f"expected TargetCrossing records, got {type(c).__name__}")
    values = np.array([math.inf if c.censored else c.samples_to_target for c in crossings], dtype=float)
    rng = np.random.default_rng(seed)
    if statistic == GEOMETRIC_MEAN and not all(c.censored for c in crossings):
        bounds = np.array([c.max_samples for c in crossings], dtype=float)
        point, lo, hi = _geometric_mean(values, bounds, n_boot, rng, confidence)
    else:
        statistic = MEDIAN  # all censored: inf either way
        point = float(np.median(values))
        lo, hi = (
            (point, point)
            if values.size == 1
            else percentile_interval(bootstrap_medians(values, n_boot, rng), confidence)
        )
    lo, hi = min(lo, point), max(hi, point)
    return TargetEstimate(
        samples_to_target=point,
        ci_low=lo,
        ci_high=hi,
        n_seeds=len(crossings),
        n_censored=sum(c.censored for c in crossings),
        per_seed=tuple(c.samples_to_target for c in crossings),
        censored_at=tuple(c.max_samples if c.censored else None for c in crossings),
        confidence=confidence,
        seed_ids=() if seed_ids is None else tuple(int(i) for i in seed_ids),
        statistic=statistic,
    )


def _geometric_mean(
    values: np.ndarray, bounds: np.ndarray, n_boot: int, rng: np.random.Generator, confidence: float
) -> tuple[float, float, float]:
    """(point, low, high) of estimate_over_seeds' GEOMETRIC_MEAN from each seed's R (inf where
    censored) and bound: censored seeds at their bounds, and at +inf for the high end."""
    high = np.log(values)
    low = np.where(np.isinf(values), np.log(bounds), high)
    point = math.exp(float(low.mean()))
    idx = rng.integers(0, low.size, size=(n_boot, low.size))
    lo = math.exp(percentile_interval(low[idx].mean(axis=1), confidence)[0])
    hi_log = percentile_interval(high[idx].mean(axis=1), confidence)[1]
    return point, lo, math.exp(hi_log) if math.isfinite(hi_log) else math.inf


def estimate_from_value(
    samples_to_target: float,
    ci: tuple[float, float] | None = None,
    *,
    confidence: float = 0.9,
) -> TargetEstimate:
    """A TargetEstimate from a user-provided R (e.g. a past run), with an optional interval.

    It counts as one uncensored seed (`has_spread` False); a given `ci` is kept as the interval
    (at `confidence`) and is used by `ratio_to_reference`'s one-seed fallback.
    """
    _check_confidence(confidence)
    r = float(samples_to_target)
    if not math.isfinite(r) or r <= 0:
        raise AnalysisError(f"samples-to-target must be a finite positive number, got {samples_to_target}")
    lo, hi = (r, r) if ci is None else (float(ci[0]), float(ci[1]))
    if math.isnan(lo) or math.isnan(hi) or not 0 <= lo <= r <= hi:
        raise AnalysisError(
            f"the interval {ci} must satisfy 0 <= low <= {r} <= high; pass (low, high) in samples"
        )
    return TargetEstimate(
        samples_to_target=r,
        ci_low=lo,
        ci_high=hi,
        n_seeds=1,
        n_censored=0,
        per_seed=(r,),
        censored_at=(None,),
        confidence=confidence,
    )
