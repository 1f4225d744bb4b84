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

from batchtune.analysis.sample.crossing_batch import from_fit, read_batch
from batchtune.analysis.sample.intervals import ShapeFreeCrossing, shape_free_crossing
from batchtune.analysis.sample.joint import JointFit, fit_joint
from batchtune.analysis.sample.ratio import (
    DEVIATES,
    INCONCLUSIVE,
    INVARIANT,
    REFERENCE,
    Verdict,
    classify,
    ratio_to_reference,
)
from batchtune.analysis.sample.scaling import McCandlishFit, fit_mccandlish
from batchtune.analysis.sample.seeds import TargetEstimate
from batchtune.errors import AnalysisError


@dataclass(frozen=True)
class CriticalBatch:
    """The critical training batch: a measured batch read from the 1+tol crossings, per-batch evidence.

    Two crossings of R(B)/R(B0) = 1 + tol: `shape_free` (`intervals.shape_free_crossing`, read off
    the measured batches without assuming a shape between them: the one every report quotes, and
    the one that says "no critical batch in the measured range") and the joint fit's (`joint`,
    `joint.fit_joint` over every run that reached the target, seeds paired: `crossing` where the
    chosen shape reaches 1 + tol, `crossing_ci` its profile interval, which holds only if the shape
    does; `interpolated` = `crossing`). `batch`: a measured batch below `failed_from` (the smallest
    batch that diverged, ran out of memory or never reached the target in every seed: the critical
    batch is below it), read by `crossing_batch.read_batch`: at or below the McCandlish crossing where
    that shape holds, else the larger of the two readings, inside the quoted interval's bracket and
    the verdicts. `lower` / `upper`: the largest measured batch at or below the quoted interval (at
    least B0) and the smallest above it (or `failed_from`; None when none: "at least").
    `model_batch`: what the joint fit's crossing alone gives (the estimate before 2026-12-03), a
    diagnostic. Without either crossing (too few runs: `reason` says why) the walk decides:
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
    shape_free: ShapeFreeCrossing | None = None  # the crossing's interval without a model of R(B)
    model_batch: float | None = None  # what the joint fit's crossing alone gives: a diagnostic

    @property
    def quoted_crossing(self) -> tuple[float, tuple[float, float], str] | None:
        """The one 1+tol crossing a report quotes, its interval and what that interval is: the
        shape-free one where there is one (its 90% covers 85-95% on McCandlish and NQM curves
        alike, benchmarks/out/coverage_shape_free.txt), else the joint fit's, which holds only if
        the fitted shape does (36% on the NQM). None when there is neither."""
        if self.shape_free is not None:
            sf = self.shape_free
            return sf.crossing, sf.ci, f"{100 * sf.confidence:.0f}% shape-free interval"
        if self.crossing_ci is None:
            return None
        j = self.joint
        kind = (
            f"{100 * j.confidence:.0f}% interval of the joint {j.best.model} fit"
            if j
            else "the fit's interval"
        )
        cross = self.crossing if self.crossing is not None else math.nan
        return cross, self.crossing_ci, kind + ", which holds only if its shape does"

    def fit_line(self) -> str:
        """The joint fit in one line, without its crossing where the shape-free one is quoted."""
        return self.joint.describe(with_crossing=self.shape_free is None) if self.joint is not None else ""


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


def _estimate(
    joint: JointFit | None,
    shape_free: ShapeFreeCrossing | None,
    ascending: list[Verdict],
    measured: np.ndarray,
    b0: float,
    walked: tuple[float, float | None],
    failed_from: float | None,
) -> tuple[float, float, float | None, float | None, str, list[str]]:
    """(batch, lower, upper, the joint fit's own batch, reason head, notes): crossing_batch's rule,
    else the walk. The notes' first entry is the verdicts' clamp ("" when none)."""
    walk = walked[0]
    fit = from_fit(joint, ascending, measured, b0, failed_from) if joint is not None else None
    if shape_free is not None:
        crit, lower, upper, source, clamp = read_batch(
            joint, shape_free, ascending, measured, b0, failed_from
        )
    elif fit is not None:
        (crit, lower, upper, clamp), source = fit, "the joint fit's crossing"
    else:
        head = f"critical batch {walk:g}" + (" (the reference)" if walk == b0 else "") + " by the walk"
        return walk, walk, walked[1], None, head, [""]
    head = f"critical batch {crit:g}" + (" (the reference)" if crit == b0 else "")
    head += f": the largest measured batch at or below {source}"
    if joint is not None:
        head += f"; {joint.describe(with_crossing=shape_free is None)}"
    notes = [clamp]
    if crit != walk:
        notes.append(f"the verdict walk alone would say {walk:g} (a lower bound)")
    return crit, lower, upper, fit[0] if fit is not None else None, head, notes


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


def _shape_free(
    runs: tuple[list[float], list[float], list[int] | None],
    b0: float,
    tol: float,
    confidence: float,
    failed_from: float | None,
    seed: int,
) -> ShapeFreeCrossing | None:
    """The shape-free crossing of the usable runs (seeds paired when known, else one shared
    effect); None when too few runs leave it no degree of freedom."""
    bb, rr, ss = runs
    if not bb or min(bb) != b0:
        return None
    seeds = ss if ss is not None and len(set(ss)) < len(ss) else [0] * len(bb)
    try:
        return shape_free_crossing(
            bb, rr, seeds, reference_batch=b0, tol=tol, confidence=confidence, failed_from=failed_from,
            seed=seed,
        )  # fmt: skip
    except AnalysisError:
        return None


def _validated(
    batches: Sequence[float], estimates: Sequence[TargetEstimate], reference_index: int | None, tol: float
) -> tuple[np.ndarray, int]:
    """The batches as an array and the reference's index; AnalysisError on input it cannot use."""
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
    return b, ref_i


def _reference_never_reached(b: np.ndarray, ref_i: int, tol: float) -> CriticalBatch:
    b0 = float(b[ref_i])
    why = f"reference batch {b0:g} never reached the target (R0 = inf)"
    return CriticalBatch(
        batch=None,
        lower=None,
        upper=None,
        interpolated=None,
        verdicts=tuple(
            Verdict(float(b[i]), REFERENCE if i == ref_i else INCONCLUSIVE, None, why) for i in range(b.size)
        ),
        tol=tol,
        reason=why + "; lower the target or choose another reference",
        reference_batch=b0,
        fit=None,
    )


def _verdicts(
    b: np.ndarray, estimates: Sequence[TargetEstimate], ref_i: int, tol: float, confidence: float, seed: int
) -> list[Verdict]:
    """Each batch's ratio to the reference, classified against 1 + tol (ratio.classify)."""
    ref, out = estimates[ref_i], []
    for i in range(b.size):
        if i == ref_i:
            out.append(Verdict(float(b[i]), REFERENCE, None, "reference batch"))
            continue
        ratio = ratio_to_reference(ref, estimates[i], confidence=confidence, seed=seed + int(i))
        status, why = classify(ratio, tol=tol)
        out.append(Verdict(float(b[i]), status, ratio, why))
    return out


def _reason(
    head: str, crit: float, upper: float | None, failed_from: float | None, later: list[float]
) -> list[str]:
    """The reason's parts after its head: the failed bound, an open interval, noisy invariants."""
    parts = [head]
    if failed_from is not None:
        parts.append(
            f"every seed failed or never reached the target from {failed_from:g}: "
            "the critical batch is below it"
        )
    elif upper is None:
        parts.append(f"no measured batch is above the interval: at least {crit:g}")
    if later:
        shown = ", ".join(f"{x:g}" for x in later)
        parts.append(f"larger batches {shown} test invariant again: noisy data, add seeds")
    return parts


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
    b, ref_i = _validated(batches, estimates, reference_index, tol)
    b0 = float(b[ref_i])
    if math.isinf(estimates[ref_i].samples_to_target):
        return _reference_never_reached(b, ref_i, tol)
    verdicts = _verdicts(b, estimates, ref_i, tol, confidence, seed)
    ascending = [verdicts[i] for i in np.argsort(b)]
    walk, walk_upper, notes = _walk(ascending, b0, tol)
    never = [float(b[i]) for i in range(b.size) if math.isinf(estimates[i].samples_to_target)]
    failed_from = min([*never, *(float(x) for x in failed_batches)], default=None)
    usable = np.array([math.isfinite(e.samples_to_target) for e in estimates]) & (
        b < (failed_from if failed_from is not None else math.inf)
    )
    joint = None
    runs = _joint_runs(b, estimates, usable)
    try:
        joint = fit_joint(*runs, reference_batch=b0, tol=tol, confidence=confidence)
    except AnalysisError as err:
        notes.insert(0, f"no joint fit ({err})")
    shape_free = _shape_free(runs, b0, tol, confidence, failed_from, seed)
    if joint is None:
        notes[0] += ": the walk decides" if shape_free is None else ": the shape-free crossing decides"
    measured = np.sort(b[usable])
    crit, lower, upper, model_crit, head, more = _estimate(
        joint, shape_free, ascending, measured, b0, (walk, walk_upper), failed_from
    )
    notes = [m for m in [*more[:1], *notes, *more[1:]] if m]
    later = [v.batch for v in ascending if v.batch > walk and v.status == INVARIANT]
    parts = [*_reason(head, crit, upper, failed_from, later), *notes]
    return CriticalBatch(
        batch=crit,
        lower=lower,
        upper=upper,
        interpolated=joint.best.crossing if joint is not None else None,
        verdicts=tuple(verdicts),
        tol=tol,
        reason="; ".join(parts),
        reference_batch=b0,
        fit=_model_crossing(b, estimates, confidence),
        crossing=joint.best.crossing if joint is not None else None,
        crossing_ci=joint.best.crossing_ci if joint is not None else None,
        joint=joint,
        failed_from=failed_from,
        walk_batch=walk,
        shape_free=shape_free,
        model_batch=model_crit,
    )
