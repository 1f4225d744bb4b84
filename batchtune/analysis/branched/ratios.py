"""Branched probes: the local critical batch at a checkpoint (pure numpy/scipy; docs/method.md §3.2
short probes, §6, §9). Its trend against progress and R(B0)'s extrapolation: analysis/branched/progress.py.

Merrill et al. 2025 ("Critical Batch Size Revisited", arXiv 2505.23971) branch from a checkpoint of
a run at batch B0: each branch trains at k*B0 with the LR by the scaling rule for a short window,
and is "matched" when its smoothed loss keeps up with the smaller batch. We use the estimator of
ordinary probes on the samples axis instead of a fixed loss tolerance, so the same statistics apply:

    level_c   = median over seeds of the control's fitted metric at W samples past checkpoint c
                (the control is the branch at B0 itself: the trunk's continuation, one per seed)
    R_c(B, s) = samples the branch at B, seed s, needs past c to reach level_c (isotonic fit,
                curves.samples_to_target; censored past max_window_factor * W)
    local ratio R_c(B, s) / R_c(B0, s), paired over seeds; the local critical batch at c is the
    joint 1+tol crossing of critical.critical_batch over these R's, with its profile interval.

Every branch curve starts from the checkpoint's own value at 0 samples, so a large batch whose first
logged point lies far past c is still interpolated from where it began.

A window of one or two optimiser steps says nothing about a large batch: on the NQM at the SGD
stability edge a branch at 1024 (which diverges in a full run) keeps up with the control over its
single step in 2 of 12 seeds. So a batch B may carry its own window W_B = max(W, min_steps * B)
(`windows`): its level is the controls' fitted metric W_B past c, its ratio is read at that level,
and its R_c is put on the common scale as R_c(B0, s) at W times that ratio (paired per seed).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from batchtune.analysis.sample.critical import CriticalBatch, critical_batch
from batchtune.analysis.sample.curves import TargetCrossing, samples_to_target
from batchtune.analysis.sample.monotone import isotonic_increasing
from batchtune.analysis.sample.seeds import TargetEstimate, estimate_over_seeds
from batchtune.errors import AnalysisError, NoProgress


@dataclass(frozen=True)
class BranchCurve:
    """One branch (or control) run: samples counted from the checkpoint, and its metric."""

    batch: float
    seed: int
    samples: np.ndarray  # samples consumed since the checkpoint (> 0), ascending
    values: np.ndarray
    failed: bool = False  # diverged / OOM / failed: censored at `consumed`
    consumed: float = 0.0  # samples the branch spent (its censoring bound)


@dataclass(frozen=True)
class LocalCritical:
    """The local critical batch at one checkpoint (see the module docstring).

    `critical.crossing` / `crossing_ci`: the joint 1+tol crossing and its interval; None when the
    joint fit was not possible (then `critical.batch` is the walk's lower bound). `ratios[B]`: per
    seed R_c(B, s) / R_c(B0, s) (inf where censored). `start_value`: the trunk's metric at c.
    """

    checkpoint_samples: float
    start_value: float
    level: float
    window_samples: float
    estimates: dict[float, TargetEstimate]
    ratios: dict[float, dict[int, float]]
    critical: CriticalBatch
    branch_samples: float  # samples all branches of this checkpoint spent
    windows: dict[float, float] = field(default_factory=dict)  # batch -> its own window, where > W
    # batch -> seed -> the lower bound of a censored ratio (the samples the branch spent before it
    # stopped short of the level, over R_c(B0, s)); a failed (diverged, OOM) branch has none: inf
    bounds: dict[float, dict[int, float]] = field(default_factory=dict)

    def observed(self, batch: float) -> dict[int, tuple[float, bool]]:
        """Per seed (ratio, censored) at ``batch``: a censored seed's ratio is its bound (a lower
        bound), a failed one's inf; seeds with no paired control are left out."""
        bounds = self.bounds.get(batch, {})
        return {
            s: (bounds[s], True) if s in bounds else (r, False)
            for s, r in self.ratios.get(batch, {}).items()
            if not math.isnan(r)
        }

    @property
    def point(self) -> float:
        """The local critical batch: the joint crossing, else the largest batch the walk adopted."""
        c = self.critical
        if c.crossing is not None and math.isfinite(c.crossing):
            return float(c.crossing)
        return float(c.batch if c.batch is not None else c.reference_batch)

    @property
    def interval(self) -> tuple[float, float]:
        """The joint crossing's interval, else the walk's bracket; it always holds `point` (a
        crossing that never reaches 1+tol leaves the walk's batch as the point, below the
        crossing's interval)."""
        c = self.critical
        if c.crossing_ci is not None:
            lo, hi = float(c.crossing_ci[0]), float(c.crossing_ci[1])
            return min(lo, self.point), max(hi, self.point)
        lo = float(c.lower if c.lower is not None else c.reference_batch)
        return lo, float(c.upper) if c.upper is not None else math.inf


def fitted_at(samples: np.ndarray, values: np.ndarray, x: float, *, higher_is_better: bool) -> float:
    """The isotonic fit of a curve evaluated at ``x`` samples (linear between fitted points)."""
    s = np.asarray(samples, dtype=float)
    sign = 1.0 if higher_is_better else -1.0
    xs, inv, cnt = np.unique(s, return_inverse=True, return_counts=True)
    ys = np.bincount(inv, weights=sign * np.asarray(values, dtype=float)) / cnt
    fit = isotonic_increasing(ys, cnt.astype(float))
    return float(sign * np.interp(x, xs, fit))


def control_level(
    checkpoint_samples: float,
    start_value: float,
    curves: Sequence[BranchCurve],
    reference_batch: float,
    window_samples: float,
    higher_is_better: bool,
    level_seeds: Collection[int] | None = None,
    *,
    unit: str = "samples",
) -> float:
    """The local target: median over seeds of the controls' fitted metric one window past c
    (``unit``: what the sample axis counts, for the errors: samples, or a pre-training run's tokens).

    ``level_seeds``: only these seeds' controls set it. A branched probe's confirmation seeds
    (branch.confirm_seeds) pair with controls of their own but leave the level alone, so the
    branches that already stopped at it stay readable. (One level for all seeds, not one per seed:
    on a noisy reward one seed's control can show no progress in a window of its own, which would
    give it a zero R_c.)
    """
    controls = [
        c
        for c in curves
        if c.batch == reference_batch
        and not c.failed
        and c.samples.size
        and (level_seeds is None or c.seed in level_seeds)
    ]
    if not controls:
        raise AnalysisError(
            f"checkpoint at {checkpoint_samples:g} {unit} has no finished control branch at the "
            f"reference batch {reference_batch:g}; rerun the probe to finish it"
        )
    short = [c.seed for c in controls if c.samples[-1] < window_samples]
    if short:
        raise AnalysisError(
            f"control branches of seeds {short} at {checkpoint_samples:g} {unit} stopped before the "
            f"window of {window_samples:g} {unit}; rerun the probe"
        )
    at = [
        fitted_at(
            np.r_[0.0, c.samples],
            np.r_[start_value, c.values],
            window_samples,
            higher_is_better=higher_is_better,
        )
        for c in controls
    ]
    level = float(np.median(at))
    if (level - start_value) * (1 if higher_is_better else -1) <= 0:
        # every branch "reaches" a level it started at: R = 0 for all, no ratio to read
        raise NoProgress(
            f"the control branches made no progress in the window after the checkpoint at "
            f"{checkpoint_samples:g} {unit} (metric {start_value:.4g} there, {level:.4g} fitted one "
            f"window of {window_samples:g} {unit} later): the trunk has plateaued there or the metric "
            "is too noisy for the window; use earlier branch.checkpoints or a longer branch.window_samples"
        )
    return level


def _crossing(c: BranchCurve, start_value: float, level: float, higher_is_better: bool) -> TargetCrossing:
    if c.failed or c.samples.size == 0:
        return TargetCrossing(None, True, float(max(c.consumed, 1.0)))
    return samples_to_target(
        np.r_[0.0, c.samples], np.r_[start_value, c.values], level, higher_is_better=higher_is_better
    )


crossing = _crossing  # a branch's crossing of a level, from its checkpoint (measure/branched_async.py)

ADOPT, REJECT, MORE = "adopt", "reject", "more"


def adoption(
    ratios: Sequence[float],
    *,
    tol: float,
    confidence: float,
    min_seeds: int,
    max_seeds: int,
    min_reject_seeds: int = 1,
) -> str:
    """The sequential test of a branched batch at one checkpoint, from its paired ratios so far
    (one per seed; inf where the branch never reached the level, NaN where the seed's control did
    not): ADOPT (the search may climb past it), REJECT, or MORE (branch it at another seed).

    REJECT when any seed is unpaired or never reached the level, or the mean log ratio is past
    log(1+tol), on ``min_reject_seeds`` seeds or more (fewer: MORE, unless the mean is past
    2 log(1+tol), which one seed is enough to reject). ADOPT needs ``min_seeds`` seeds and the
    one-sided ``confidence`` upper bound of the mean log ratio (Student t over the seeds) within
    log(1+tol): at the edge of stability one seed's branch keeps up and the next never reaches the
    level, and two lucky seeds must not decide. MORE while neither holds and fewer than ``max_seeds``
    seeds were branched; at ``max_seeds`` an undecided batch is REJECTED (adopting past the critical
    batch costs more than stopping below it).
    One seed (``min_seeds`` 1) is judged by its point.
    """
    r = np.asarray(ratios, dtype=float)
    if r.size == 0 or not np.all(np.isfinite(r) & (r > 0)):
        return REJECT
    lr = np.log(r)
    bound = math.log1p(tol)
    mean = float(lr.mean())
    if mean > bound:
        if r.size >= min_reject_seeds or mean > 2 * bound or r.size >= max_seeds:
            return REJECT
        return MORE
    if r.size >= max(min_seeds, 1):
        if r.size == 1:
            return ADOPT
        upper = mean + float(stats.t.ppf(confidence, r.size - 1)) * float(lr.std(ddof=1)) / math.sqrt(r.size)
        if upper <= bound:
            return ADOPT
    return MORE if r.size < max_seeds else REJECT


def reaches(curve: BranchCurve, start_value: float, level: float, *, higher_is_better: bool) -> bool:
    """Whether a branch (or control) curve's fit reaches ``level`` (a failed one never does)."""
    return _crossing(curve, start_value, level, higher_is_better).samples_to_target is not None


def local_ratios(
    start_value: float,
    curves: Sequence[BranchCurve],
    reference_batch: float,
    level: float,
    higher_is_better: bool,
    batch: float,
) -> list[float]:
    """Per seed R_c(batch, s) / R_c(B0, s) to ``level`` (inf where the branch never reached it);
    a seed whose control never reached it is left out."""
    ref = {
        c.seed: _crossing(c, start_value, level, higher_is_better)
        for c in curves
        if c.batch == reference_batch
    }
    out = []
    for c in curves:
        r0 = ref[c.seed].samples_to_target if c.batch == batch and c.seed in ref else None
        if r0 is None:
            continue
        r = _crossing(c, start_value, level, higher_is_better).samples_to_target
        out.append(math.inf if r is None else r / max(r0, 1e-12))
    return out


_Readings = tuple[
    dict[float, list[tuple[int, TargetCrossing]]],  # batch -> (seed, crossing on the common scale)
    dict[float, dict[int, float]],  # batch -> seed -> local ratio
    dict[float, dict[int, float]],  # batch -> seed -> lower bound of a censored ratio
    dict[float, int],  # batch -> branches that failed (or logged nothing)
]


def _ratio_and_bound(
    c: BranchCurve, crossing: TargetCrossing, r0_s: float | None
) -> tuple[float, float | None]:
    """The branch's local ratio (NaN without a control crossing to pair with, inf where it never
    reached the level) and, for a branch that ran but stopped short, its ratio's lower bound."""
    ratio = (
        math.nan
        if not r0_s
        else math.inf
        if crossing.samples_to_target is None
        else crossing.samples_to_target / r0_s
    )
    if math.isinf(ratio) and not (c.failed or c.samples.size == 0) and r0_s:
        return ratio, crossing.max_samples / r0_s
    return ratio, None


def _on_common_scale(
    crossing: TargetCrossing, base: TargetCrossing | None, r0_s: float | None
) -> TargetCrossing:
    """A crossing read at a batch's own window, as R_c(B0, s) at the common window (``base``) times
    its ratio at its own (module docstring); unchanged where either control crossing is missing."""
    base_s = base.samples_to_target if base is not None else None
    scale = (base_s or math.nan) / (r0_s or math.nan)
    if not (math.isfinite(scale) and scale > 0):
        return crossing
    r = crossing.samples_to_target
    return dataclasses.replace(
        crossing, samples_to_target=None if r is None else r * scale, max_samples=crossing.max_samples * scale
    )


def _read_branches(
    curves: Sequence[BranchCurve],
    start_value: float,
    levels: Mapping[float, float],
    ref_at: Mapping[float, Mapping[int, TargetCrossing]],
    own: Mapping[float, float],
    window_samples: float,
    higher_is_better: bool,
) -> _Readings:
    """Every curve's crossing of its window's level, its paired ratio and bound, and the failures."""
    by_batch: dict[float, list[tuple[int, TargetCrossing]]] = {}
    ratios: dict[float, dict[int, float]] = {}
    bounds: dict[float, dict[int, float]] = {}
    failed: dict[float, int] = {}
    for c in curves:
        v = own.get(c.batch, window_samples)
        crossing = _crossing(c, start_value, levels[v], higher_is_better)
        r0 = ref_at[v].get(c.seed)
        r0_s = r0.samples_to_target if r0 is not None else None
        ratio, bound = _ratio_and_bound(c, crossing, r0_s)
        if bound is not None:
            bounds.setdefault(c.batch, {})[c.seed] = bound
        if c.batch in own:
            crossing = _on_common_scale(crossing, ref_at[window_samples].get(c.seed), r0_s)
        if c.failed or c.samples.size == 0:
            failed[c.batch] = failed.get(c.batch, 0) + 1
        by_batch.setdefault(c.batch, []).append((c.seed, crossing))
        ratios.setdefault(c.batch, {})[c.seed] = ratio
    return by_batch, ratios, bounds, failed


def local_critical_batch(
    checkpoint_samples: float,
    start_value: float,
    curves: Sequence[BranchCurve],
    *,
    reference_batch: float,
    window_samples: float,
    higher_is_better: bool,
    tol: float = 0.1,
    confidence: float = 0.9,
    windows: Mapping[float, float] | None = None,
    level_seeds: Collection[int] | None = None,
    unit: str = "samples",
) -> LocalCritical:
    """The local critical batch at one checkpoint from its branch curves (module docstring).

    ``windows``: batch -> its own window where longer than ``window_samples`` (the controls must
    reach the longest). ``level_seeds``, ``unit``: as in `control_level`."""
    w = float(window_samples)
    own = {
        float(b): float(v) for b, v in (windows or {}).items() if v > window_samples and b != reference_batch
    }
    args = (checkpoint_samples, start_value, curves, reference_batch)
    levels = {
        v: control_level(*args, v, higher_is_better, level_seeds, unit=unit) for v in {w, *own.values()}
    }
    controls = [c for c in curves if c.batch == reference_batch]
    ref_at = {  # per window, each seed's control crossing of its level
        v: {c.seed: _crossing(c, start_value, lv, higher_is_better) for c in controls}
        for v, lv in levels.items()
    }
    by_batch, ratios, bounds, failed = _read_branches(
        curves, start_value, levels, ref_at, own, w, higher_is_better
    )
    batches = sorted(by_batch)
    failed_batches = [b for b in batches if failed.get(b, 0) == len(by_batch[b])]
    measured = [b for b in batches if b not in failed_batches]
    estimates = {
        b: estimate_over_seeds(
            [x for _, x in by_batch[b]], confidence=confidence, seed_ids=[s for s, _ in by_batch[b]]
        )
        for b in measured
    }
    crit = critical_batch(
        measured,
        [estimates[b] for b in measured],
        reference_index=measured.index(reference_batch),
        tol=tol,
        confidence=confidence,
        failed_batches=failed_batches,
    )
    return LocalCritical(
        checkpoint_samples=float(checkpoint_samples),
        start_value=float(start_value),
        level=levels[w],
        window_samples=w,
        estimates=estimates,
        ratios=ratios,
        critical=crit,
        branch_samples=float(sum(c.consumed for c in curves)),
        windows={b: v for b, v in own.items() if b in by_batch},
        bounds=bounds,
    )
