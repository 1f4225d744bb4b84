"""Quality curves against samples consumed: samples-to-target R, a smoothed envelope, seeds.

R(B) is read off a fitted monotone curve of the metric against samples consumed (responses for
RL, tokens for pre-training), never against steps: isotonic regression plus a monotone cubic
(`monotone.py`), whose bias is measured on curves of known R. A run that stops before the target
is *censored*: it says "R > samples consumed", it is not discarded.

The envelope (for plots and matched-samples comparisons): EMA with alpha 0.5 as in Merrill et al.
2025 ("Critical Batch Size Revisited"), then a running max (min when lower is better).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.signal import lfilter

from batchtune.analysis.sample.monotone import monotone_crossing, noise_sd
from batchtune.errors import AnalysisError

CROSSING_METHODS = ("isotonic", "running_best")
# A probe run stops once it has gone 25% past its estimated R. Stopping at the first point where the
# estimate is confirmed selects estimates that dipped early (optional stopping): on the noisiest
# recovery cell a 20% margin read R 2.5% low (s.e. 0.4), 25% reads it 0.7% low, for 1.26 R spent
# instead of 1.19 R (benchmarks/confirm_margin.py, docs/analysis-sample-efficiency.md).
CONFIRM_MARGIN = 0.25


def ema(values: ArrayLike, alpha: float) -> np.ndarray:
    """Exponential moving average: s_0 = x_0, s_t = alpha * x_t + (1 - alpha) * s_{t-1}.

    `alpha` is the weight of the new point. 0 and 1 both mean "no smoothing" (the values are
    returned unchanged): alpha = 0 would otherwise freeze the curve at its first point, which is
    never what a caller wants. The EMA lags a trending curve by about (1 - alpha) / alpha points.
    """
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise AnalysisError(f"ema expects a 1-D array, got shape {x.shape}; pass one curve at a time")
    if not (0.0 <= alpha <= 1.0) or math.isnan(alpha):
        raise AnalysisError(f"ema alpha must lie in [0, 1], got {alpha}; 0.5 is the usual choice")
    if alpha in (0.0, 1.0) or x.size == 0:
        return x.copy()
    # s_t - (1 - alpha) s_{t-1} = alpha x_t, started from s_{-1} = x_0 so that s_0 = x_0.
    out, _ = lfilter([alpha], [1.0, alpha - 1.0], x, zi=[(1.0 - alpha) * x[0]])
    return np.asarray(out, dtype=float)


def clean_curve(samples: ArrayLike, metric: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """The curve sorted by samples (stable), with non-finite metric points (NaN, +-inf) dropped.

    This is the x-axis that `monotone_envelope` returns its values on. Samples must be finite and
    non-negative; at least one finite metric point must remain.
    """
    s = np.asarray(samples, dtype=float)
    m = np.asarray(metric, dtype=float)
    if s.ndim != 1 or m.ndim != 1 or s.shape != m.shape:
        raise AnalysisError(
            f"samples and metric must be 1-D arrays of equal length, got shapes {s.shape} and "
            f"{m.shape}; pass one run's curve"
        )
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        raise AnalysisError(
            "samples consumed must be finite and >= 0; check the run's step records "
            "(samples are cumulative responses or tokens)"
        )
    keep = np.isfinite(m)
    if not np.any(keep):
        raise AnalysisError(
            f"the curve has no finite metric value among its {m.size} points; "
            "check that the evaluation actually ran and logged the metric"
        )
    s, m = s[keep], m[keep]
    order = np.argsort(s, kind="stable")
    return s[order], m[order]


def monotone_envelope(
    samples: ArrayLike,
    metric: ArrayLike,
    *,
    higher_is_better: bool = True,
    ema_alpha: float = 0.5,
) -> np.ndarray:
    """EMA-smoothed running best of the metric: env_t = max_{u<=t} ema(metric)_u (min if lower).

    Points are sorted by samples and non-finite metric points dropped first; the result is aligned
    with `clean_curve(samples, metric)[0]`. `ema_alpha` 0 or 1 disables smoothing.
    """
    _, m = clean_curve(samples, metric)
    smooth = ema(m, ema_alpha)
    if higher_is_better:
        return np.maximum.accumulate(smooth)
    return np.minimum.accumulate(smooth)


@dataclass(frozen=True)
class TargetCrossing:
    """Where one run first reached the target, in samples consumed.

    `samples_to_target` is None and `censored` True when it never did: the run only tells us
    R > `max_samples` (the samples consumed when it stopped, the censoring bound).
    """

    samples_to_target: float | None
    censored: bool
    max_samples: float
    method: str = "isotonic"  # how R was read off the curve, one of CROSSING_METHODS
    noise_sd: float | None = None  # per-point metric noise estimated from the curve (metric units)

    def __post_init__(self) -> None:
        if self.censored != (self.samples_to_target is None):
            raise AnalysisError(
                "a TargetCrossing is censored exactly when samples_to_target is None; got "
                f"censored={self.censored}, samples_to_target={self.samples_to_target}"
            )
        if not math.isfinite(self.max_samples) or self.max_samples < 0:
            raise AnalysisError(f"max_samples must be finite and >= 0, got {self.max_samples}")
        r = self.samples_to_target
        if r is not None and (not math.isfinite(r) or r < 0):
            raise AnalysisError(f"samples_to_target must be finite and >= 0, got {r}")


def samples_to_target(
    samples: ArrayLike,
    metric: ArrayLike,
    target: float,
    *,
    higher_is_better: bool = True,
    ema_alpha: float = 0.5,
    method: str = "isotonic",
) -> TargetCrossing:
    """Samples-to-target R of one run, read off a fitted monotone curve (docs/method.md §8).

    method "isotonic" (the default): the crossing of the isotonic regression of the metric on
    samples, interpolated by a monotone cubic through the fitted blocks (`monotone.py`). Noise
    cannot make it cross early, and it needs no smoothing, so `ema_alpha` is ignored. Measured
    bias on curves of known R: benchmarks/out/recovery_samples_to_target.txt.
    method "running_best" (the former estimator, kept for comparison): first crossing of the
    EMA-smoothed running best, linearly interpolated between the bracketing points and moved back
    by the EMA lag (1 - alpha) / alpha points, never before the raw curve's own first crossing.
    It reads noisy small batches early and concave curves at large batches late.
    Meeting means >= target (<= when lower is better). Never reached: censored at the last
    point's samples. `noise_sd` on the result is the per-point noise estimated from the curve.
    """
    if not math.isfinite(target):
        raise AnalysisError(f"the target must be a finite number, got {target}")
    if method not in CROSSING_METHODS:
        raise AnalysisError(f"unknown samples-to-target method {method!r}; use one of {CROSSING_METHODS}")
    s, m = clean_curve(samples, metric)
    max_samples = float(s[-1])
    sd = noise_sd(m)
    if method == "isotonic":
        sign = 1.0 if higher_is_better else -1.0
        r = monotone_crossing(s, sign * m, sign * target)
    else:
        r = _running_best_crossing(s, m, target, higher_is_better, ema_alpha)
    return TargetCrossing(
        samples_to_target=r, censored=r is None, max_samples=max_samples, method=method, noise_sd=sd
    )


def target_confirmed(crossing: TargetCrossing, *, margin: float = CONFIRM_MARGIN) -> bool:
    """True when the run reached the target and went on for `margin` x R samples past it.

    The isotonic fit's last block is biased up when the curve stops right at the crossing (the
    fit's boundary effect), and the first point at which an estimate is confirmed favours
    estimates that dipped early, so a probe that stops early waits until samples >= (1 + margin) R.
    """
    if crossing.censored or crossing.samples_to_target is None:
        return False
    return crossing.max_samples >= (1.0 + margin) * crossing.samples_to_target


def _running_best_crossing(
    s: np.ndarray, m: np.ndarray, target: float, higher_is_better: bool, ema_alpha: float
) -> float | None:
    env = monotone_envelope(s, m, higher_is_better=higher_is_better, ema_alpha=ema_alpha)
    met = env >= target if higher_is_better else env <= target
    if not np.any(met):
        return None
    i = int(np.argmax(met))
    if i == 0:
        return float(s[0])
    e0, e1 = env[i - 1], env[i]
    frac = (target - e0) / (e1 - e0)  # e0 misses, e1 meets, so e1 != e0 and 0 < frac <= 1
    r = float(s[i - 1] + frac * (s[i] - s[i - 1]))
    if 0.0 < ema_alpha < 1.0:
        raw_met = m >= target if higher_is_better else m <= target
        j = int(np.argmax(raw_met))
        floor = float(s[0])
        if j > 0:
            floor = float(s[j - 1] + (target - m[j - 1]) / (m[j] - m[j - 1]) * (s[j] - s[j - 1]))
        r = max(floor, r - (1.0 - ema_alpha) / ema_alpha * float(s[i] - s[i - 1]))
    return r


def curve_at(
    samples: ArrayLike,
    metric: ArrayLike,
    query_samples: ArrayLike,
    *,
    higher_is_better: bool = True,
    ema_alpha: float = 0.5,
) -> np.ndarray:
    """The envelope linearly interpolated at `query_samples`, to compare runs at matched samples.

    NaN outside the measured range [first samples, last samples]: no extrapolation. Where several
    points share one samples value, the last (best) envelope value is used.
    """
    s, _ = clean_curve(samples, metric)
    env = monotone_envelope(samples, metric, higher_is_better=higher_is_better, ema_alpha=ema_alpha)
    q = np.asarray(query_samples, dtype=float)
    # Keep the last point of each run of equal samples: the envelope there is the best.
    last = np.r_[s[1:] != s[:-1], True]
    s, env = s[last], env[last]
    out = np.interp(q, s, env) if s.size > 1 else np.where(q == s[0], env[0], np.nan)
    out = np.asarray(out, dtype=float)
    out[(q < s[0]) | (q > s[-1]) | np.isnan(q)] = np.nan
    return out


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
