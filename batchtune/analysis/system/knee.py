"""The critical generation batch: the knee of a measured throughput sweep, and of the fitted
saturating model (docs/method.md §4). The model and its fit are ``throughput.py``'s.

Pure: takes arrays and returns a small frozen record; nothing here measures anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from batchtune.analysis.system.throughput import GenThroughputFit, fit_gen_throughput, paired_arrays
from batchtune.errors import AnalysisError
from batchtune.recipe.schema import GenerationConfig

DEFAULT_KNEE_THRESHOLD = GenerationConfig.knee_threshold  # one home: the recipe schema


def knee_of_fit(fit: GenThroughputFit, threshold: float = DEFAULT_KNEE_THRESHOLD) -> float:
    """Smallest concurrency past which one doubling buys less than ``threshold`` on the fit.

    ``thr(2c)/thr(c) - 1 = t0 / (t0 + 2 t1 c) < threshold``  <=>  ``c > t0 (1 - threshold) /
    (2 t1 threshold)``; returns that bound (inf if ``t1 == 0``, 0 if ``t0 == 0``).
    """
    _check_threshold(threshold)
    if fit.t1_s == 0.0:
        return math.inf
    return fit.t0_s * (1.0 - threshold) / (2.0 * fit.t1_s * threshold)


def _check_threshold(threshold: float) -> None:
    if not (math.isfinite(threshold) and 0.0 < threshold < 1.0):
        raise AnalysisError(f"knee threshold must be a gain per doubling in (0, 1), got {threshold}.")


@dataclass(frozen=True)
class Knee:
    """The critical generation batch: the knee of the measured throughput curve (docs/method.md §4).

    ``gains_per_doubling`` holds ``(c1, gain)`` for each pair of successive measured points
    ``(c1, thr1), (c2, thr2)``, normalised to one doubling: ``(thr2/thr1)^(1/log2(c2/c1)) - 1``
    (raw, noise included). ``from_fit`` is the same knee on the fitted saturating curve
    (:func:`knee_of_fit`), None when that fit is impossible. ``saturated`` is False when throughput
    kept paying up to the largest measured point, which is then reported as the knee;
    ``ceiling`` is the concurrency that ran out of memory, if the caller saw one.
    """

    concurrency: float
    threshold: float
    gains_per_doubling: tuple[tuple[float, float], ...]
    from_fit: float | None
    reason: str
    saturated: bool
    ceiling: float | None = None


def _gain_per_doubling(c1: float, thr1: float, c2: float, thr2: float) -> float:
    return float((thr2 / thr1) ** (1.0 / math.log2(c2 / c1)) - 1.0)


def _fmt(value: float) -> str:
    return f"{value:,.4g}"


def find_knee(
    concurrency: object,
    throughput: object,
    *,
    threshold: float = DEFAULT_KNEE_THRESHOLD,
    ceiling: float | None = None,
) -> Knee:
    """The first measured concurrency after which one more doubling buys < ``threshold``.

    Decision rule (we choose, for noisy measurements): repeated concurrencies are merged by their
    median; throughput is replaced by its running maximum ``env`` (an engine allowed ``c`` sequences
    can always run fewer, so a noisy dip is not a real loss); the knee is the smallest measured
    ``c_i`` beyond which *no* pair of measured points pays ``threshold`` per doubling, i.e.
    ``max_{j>k>=i} (env_j/env_k)^(1/log2(c_j/c_k)) - 1 < threshold``. Every pair from the knee up
    counts, not only pairs that start at the knee: a flat stretch followed by a late rise is not
    saturation, and the reason's "at most" must hold for every doubling it covers. Looking past the
    next point stops one flat, noisy pair from ending the search while the curve keeps rising; on a
    smooth saturating curve (gain per doubling falling with ``c``) it equals the next-doubling rule.
    A successive pair beyond the knee whose *raw* gain exceeds that "at most" can only be a recovery
    from a dip below the running maximum; the reason names each one, so it never contradicts the
    measured table. When no point qualifies the knee is the largest measured concurrency and
    ``saturated`` is False. OOM/failed points must be left out by the caller; pass the concurrency
    that failed as ``ceiling`` so the reason names the memory cap.
    """
    _check_threshold(threshold)
    c_raw, thr_raw = paired_arrays("concurrency", concurrency, "throughput", throughput)
    c = np.unique(c_raw)
    if c.size < 2:
        raise AnalysisError(
            f"need throughput at >= 2 distinct concurrencies to find a knee, got {c_raw.tolist()}; "
            "profile a doubling sweep (e.g. 16, 32, 64, ...)."
        )
    if ceiling is not None and not (math.isfinite(ceiling) and ceiling > 0):
        raise AnalysisError(f"ceiling must be a positive concurrency, got {ceiling}.")
    thr = np.array([np.median(thr_raw[c_raw == ci]) for ci in c])
    gains = tuple(
        (float(c[i]), _gain_per_doubling(c[i], thr[i], c[i + 1], thr[i + 1])) for i in range(c.size - 1)
    )
    env = np.maximum.accumulate(thr)
    # best_from[k]: the largest gain per doubling on the envelope from c_k to any later point
    best_from = [
        max((_gain_per_doubling(c[k], env[k], c[j], env[j]), j) for j in range(k + 1, c.size))
        for k in range(c.size - 1)
    ]

    knee_idx = None
    for i in range(c.size - 1):
        if max(g for g, _ in best_from[i:]) < threshold:
            knee_idx = i
            break

    try:
        from_fit: float | None = knee_of_fit(fit_gen_throughput(c, thr), threshold)
        fit_note = ""
    except AnalysisError as exc:  # the measured knee stands on its own; say why no fit
        from_fit, fit_note = None, f" (no saturating-model knee: {exc})"

    if knee_idx is not None:
        knee_c = float(c[knee_idx])
        reason = _saturated_reason(c, thr, env, gains, best_from, knee_idx, threshold, ceiling)
    else:
        knee_c = float(c[-1])
        reason = _unsaturated_reason(knee_c, gains[-1][1], threshold, ceiling)
    return Knee(
        concurrency=knee_c,
        threshold=float(threshold),
        gains_per_doubling=gains,
        from_fit=from_fit,
        reason=reason + fit_note,
        saturated=knee_idx is not None,
        ceiling=None if ceiling is None else float(ceiling),
    )


def _saturated_reason(
    c: np.ndarray,
    thr: np.ndarray,
    env: np.ndarray,
    gains: tuple[tuple[float, float], ...],
    best_from: list[tuple[float, int]],
    knee_idx: int,
    threshold: float,
    ceiling: float | None,
) -> str:
    """find_knee's reason for a knee at ``c[knee_idx]``: the largest gain per doubling from it up and
    the pair that has it, then each raw gain above that claim, which only recovers a dip."""
    knee_c = float(c[knee_idx])
    cap = f"; concurrency {ceiling:g} ran out of memory" if ceiling is not None else ""
    best, k_best = max((best_from[k][0], k) for k in range(knee_idx, c.size - 1))
    best = max(best, 0.0)
    if round(best, 3) > 0:
        j_best = best_from[k_best][1]
        basis = (
            f"the largest gain per doubling measured from {knee_c:g} up: {c[k_best]:g} -> "
            f"{c[j_best]:g}, each point against the best throughput at or below the lower one"
        )
    else:
        basis = f"no measured point above {knee_c:g} beats the {_fmt(env[knee_idx])} at or below it"
    reason = (
        f"beyond concurrency {knee_c:g}, one more doubling buys at most {best:.1%} throughput "
        f"(threshold {threshold:.0%}; {basis}){cap}"
    )
    dips = []  # successive raw gains above that claim: each only recovers a dip (find_knee's docstring)
    for k in range(knee_idx, c.size - 1):
        if round(gains[k][1], 3) > round(best, 3):  # as printed, to 0.1%
            at = int(np.flatnonzero(thr[: k + 1] == env[k])[0])
            dips.append(
                f"{c[k]:g} -> {c[k + 1]:g} {gains[k][1]:+.1%} ({c[k]:g}: {_fmt(thr[k])} < "
                f"{_fmt(env[k])} at {c[at]:g})"
            )
    if dips:
        reason += (
            "; raw gains above that only recover dips below the best measured at or below them: "
            + ", ".join(dips)
        )
    return reason


def _unsaturated_reason(knee_c: float, last_gain: float, threshold: float, ceiling: float | None) -> str:
    """find_knee's reason when no measured point saturates: still growing up to ``knee_c``."""
    reason = (
        f"not saturated within the measured range: throughput still grew {last_gain:.1%} per "
        f"doubling up to concurrency {knee_c:g} (threshold {threshold:.0%})"
    )
    if ceiling is not None:
        return reason + f"; concurrency {ceiling:g} ran out of memory, so memory caps it at {knee_c:g}"
    return reason + "; measure higher concurrency to find the knee"
