"""Quality curves against samples consumed: one run's samples-to-target R and a smoothed envelope.

R(B) is read off a fitted monotone curve of the metric against samples consumed (responses for
RL, tokens for pre-training), never against steps: isotonic regression plus a monotone cubic
(`monotone.py`), whose bias is measured on curves of known R. A run that stops before the target
is *censored*: it says "R > samples consumed", it is not discarded.

The envelope (for plots and matched-samples comparisons): EMA with alpha 0.5 as in Merrill et al.
2025 ("Critical Batch Size Revisited"), then a running max (min when lower is better).
Over seeds (median or geometric mean, bootstrap interval): ``seeds.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.signal import lfilter

from batchtune.analysis.sample.monotone import crossing_floor, monotone_crossing, noise_sd
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
    if np.all(s[1:] >= s[:-1]):  # already in order (a probe's runs): the stable sort would keep it
        return s, m
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


# crossing_floor bounds the crossing from below exactly; this slack only guards the float rounding
# of the root solve, so the shortcut below can never skip a crossing that would be confirmed
_FLOOR_SLACK = 1e-9


def confirmed_crossing(
    samples: ArrayLike,
    metric: ArrayLike,
    target: float,
    *,
    higher_is_better: bool = True,
    margin: float = CONFIRM_MARGIN,
) -> TargetCrossing | None:
    """The isotonic crossing if `target_confirmed`, else None: the same decision as
    ``target_confirmed(samples_to_target(...))``, at the cost of the isotonic fit alone on most calls.

    A probe asks this after every evaluation once a run has reached the target. The cubic and its
    root are needed only when the fit's lower bound on R (`crossing_floor`) leaves confirmation
    possible, i.e. when samples >= (1 + margin) x that bound; before that the run is not 25% past
    any R the cubic could give.
    """
    s, m = clean_curve(samples, metric)
    sign = 1.0 if higher_is_better else -1.0
    floor = crossing_floor(s, sign * m, sign * target)
    if floor is None or not float(s[-1]) >= (1.0 + margin) * floor * (1.0 - _FLOOR_SLACK):
        return None
    crossing = samples_to_target(s, m, target, higher_is_better=higher_is_better)
    return crossing if target_confirmed(crossing, margin=margin) else None


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
