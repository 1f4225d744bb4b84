"""From the local critical batches of a branched probe to R(B) at the final target (pure).

Samples-to-target at batch B integrates the local ratios over the run: the trunk's samples between
checkpoint i and the next (the last checkpoint's segment runs to the final target) are spent at
the local rate of checkpoint i, so per seed s

    R_s(B) = R(B0) * sum_i w_i r_i(B, s) / sum_i w_i,     w_i = samples of segment i,

over the checkpoints where B was branched (r_i(B, s) = R_c(B, s) / R_c(B0, s), analysis/branched/ratios.py;
where the branch stopped short of the control's level, the bound it reached, and the seed counts as
censored; inf where it failed). R(B) is the GEOMETRIC MEAN of R_s(B) over seeds, not the median
(curves.estimate_over_seeds with GEOMETRIC_MEAN): a fixed-batch run pays one window after another,
so it pays the mean local cost, and at the edge of stability the local ratios are heavy-tailed
(on the NQM at N = 512, a third of a checkpoint's branches keep up and the rest fall far behind or
never reach the level; the median of two or three seeds reads 1.0 where the closed form needs 1.7x:
benchmarks/out/nqm_seed_spread.txt, branched_run_length.txt).
R(B0) is the trunk's own crossing of the
target, or, when the trunk stopped short, its extrapolation (`progress.extrapolate_to_target`, an
interval stated with it, carried by every absolute R as SampleEfficiency.scale_ci). These R's feed
the ordinary verdicts, joint fit and ranking (efficiency.assess, recommend), so a branched probe is
read exactly like a grid one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from batchtune.analysis.branched.offpolicy import OffPolicyInput, offpolicy_estimates
from batchtune.analysis.branched.progress import ProgressFit, extrapolate_to_target, fit_progress
from batchtune.analysis.branched.ratios import LocalCritical
from batchtune.analysis.branched.schedule import ScheduleCandidate, Segment, compare_schedule
from batchtune.analysis.decide.recommend import Recommendation
from batchtune.analysis.sample.assess import assess
from batchtune.analysis.sample.curves import TargetCrossing
from batchtune.analysis.sample.efficiency import CandidateEfficiency, SampleEfficiency
from batchtune.analysis.sample.seeds import GEOMETRIC_MEAN, estimate_over_seeds
from batchtune.errors import AnalysisError


@dataclass(frozen=True)
class BranchedSummary:
    """A branched probe read as a whole. Samples are cumulative from the trunk's start.

    `reference_samples_to_target`: R(B0) to the final target (point, low, high); `extrapolated`
    when the trunk stopped before the target. `progress`: the local critical batch against samples
    (None with fewer than 2 finite checkpoints); `critical_at_target`: its prediction at R(B0),
    (point, low, high), an extrapolation whenever R(B0) lies past the last checkpoint.
    """

    efficiency: SampleEfficiency
    locals: tuple[LocalCritical, ...]
    trunk_samples: float
    branch_samples: float
    reference_samples_to_target: tuple[float, float, float]
    extrapolated: bool
    progress: ProgressFit | None
    critical_at_target: tuple[float, float, float] | None
    notes: tuple[str, ...]

    @property
    def probe_samples(self) -> float:
        return self.trunk_samples + self.branch_samples


def segment_weights(checkpoints: Sequence[float], end: float) -> np.ndarray:
    """Samples of the trunk each checkpoint stands for: [c_i, c_{i+1}), the last to ``end``, each cut
    at ``end`` (R(B0)): a checkpoint at or past where the reference reaches the target stands for
    none (it used to keep its whole segment, and the last a zero share that stopped the schedule).
    All ones when every checkpoint lies past ``end``."""
    c = np.asarray(checkpoints, dtype=float)
    bounds = np.minimum(np.r_[c[1:], max(end, c[-1])], end)
    w = np.clip(bounds - c, 0.0, None)
    return w if w.sum() > 0 else np.ones_like(c)


def _reference_samples(
    ref_s: np.ndarray,
    ref_v: np.ndarray,
    *,
    metric: str,
    target: float,
    higher_is_better: bool,
    confidence: float,
    unit: str,
) -> tuple[tuple[float, float, float], bool, str | None]:
    """R(B0) (point, low, high) read or extrapolated from the reference's curve, whether it was
    extrapolated, and the note that says so (None when read)."""
    r0, lo0, hi0 = extrapolate_to_target(
        ref_s, ref_v, target, higher_is_better=higher_is_better, confidence=confidence
    )
    extrapolated = r0 > float(np.max(ref_s)) or lo0 != hi0
    if not math.isfinite(r0):
        raise AnalysisError(
            f"the trunk's {metric} does not trend towards {target} (no finite extrapolation): lengthen "
            "branch.trunk_samples or check the target"
        )
    if not extrapolated:
        return (r0, lo0, hi0), False, None
    note = (
        f"R(B0) {r0:,.0f} [{lo0:,.0f}, {hi0:,.0f}] {unit} is extrapolated from the trunk and its own "
        f"seed's control (which stopped at {float(np.max(ref_s)):,.0f}): metric linear in log({unit}); "
        "the interval runs from where that curve stopped to the latest of three curve forms, and every "
        "absolute R, time and full-run figure carries it (ratios between batches do not)"
    )
    return (r0, lo0, hi0), True, note


def _seed_parts(
    c: CandidateEfficiency, w: np.ndarray, locals_: Sequence[LocalCritical], reference: str
) -> dict[int, list[tuple[float, float, bool]]]:
    """Per seed, (segment weight, ratio or bound, censored) at each checkpoint that branched ``c``'s
    batch; the reference's ratio is 1, once, for every seed any checkpoint branched it at."""
    b = float(c.batch_responses)
    if c.label == reference:
        return {s: [(1.0, 1.0, False)] for s in sorted({s for lc in locals_ for s in lc.ratios.get(b, {})})}
    per_seed: dict[int, list[tuple[float, float, bool]]] = {}
    for wi, lc in zip(w, locals_, strict=True):
        for s, (r, cens) in lc.observed(b).items():
            per_seed.setdefault(s, []).append((wi, r, cens))
    return per_seed


def _seed_ratio(parts: list[tuple[float, float, bool]]) -> tuple[float, bool]:
    """One seed's ratio to R(B0), its checkpoints' ratios weighted by their segments, and whether
    it is censored (a bound at some checkpoint, or failed)."""
    if any(p[0] > 0 for p in parts):  # a checkpoint past R(B0) weighs nothing: not even a bound
        parts = [p for p in parts if p[0] > 0]
    ww = np.array([p[0] for p in parts])
    rr = np.array([p[1] for p in parts])
    if not np.all(np.isfinite(rr)):
        ratio = math.inf
    elif np.sum(ww) > 0:
        ratio = float(np.sum(ww * rr) / np.sum(ww))
    else:  # measured only at checkpoints at or past R(B0) (no trunk left to weigh): plain mean
        ratio = float(np.mean(rr))
    return ratio, any(p[2] for p in parts) or not math.isfinite(ratio)


def _estimates(
    cands: Sequence[CandidateEfficiency],
    locals_: Sequence[LocalCritical],
    w: np.ndarray,
    *,
    reference: str,
    r0: float,
    confidence: float,
) -> tuple[list[CandidateEfficiency], dict[str, dict[int, tuple[float, bool]]], list[str]]:
    """Each branched candidate with R(B) over its seeds (a geometric mean), the per-seed (ratio to
    R(B0), censored) by label that the off-policy pairing reads, and a note per candidate left out."""
    out: list[CandidateEfficiency] = []
    seen: dict[str, dict[int, tuple[float, bool]]] = {}
    notes: list[str] = []
    for c in cands:
        per_seed = _seed_parts(c, w, locals_, reference)
        if not per_seed:
            notes.append(f"{c.label} was not branched (the search bracketed the critical batch without it)")
            continue
        crossings, ids = [], []
        for s, parts in sorted(per_seed.items()):
            ratio, censored = _seed_ratio(parts)
            seen.setdefault(c.label, {})[s] = (ratio, censored)
            crossings.append(
                TargetCrossing(None, True, r0 * ratio if math.isfinite(ratio) else r0)
                if censored
                else TargetCrossing(r0 * ratio, False, r0 * ratio)
            )
            ids.append(s)
        est = estimate_over_seeds(crossings, confidence=confidence, seed_ids=ids, statistic=GEOMETRIC_MEAN)
        out.append(dataclasses.replace(c, estimate=est, family="main"))
    return out, seen, notes


def _progress_at_target(
    locals_: Sequence[LocalCritical], r0: float, confidence: float
) -> tuple[ProgressFit | None, tuple[float, float, float] | None, str | None]:
    """The local critical batch against samples and its prediction at R(B0), or why there is none."""
    try:
        progress = fit_progress(
            [lc.checkpoint_samples for lc in locals_],
            [lc.point for lc in locals_],
            [lc.interval for lc in locals_],
            confidence=confidence,
        )
        return progress, progress.predict(r0), None
    except AnalysisError as exc:
        return None, None, f"critical batch against progress: {exc}"


def summarise_branched(
    trunk_samples: np.ndarray,
    trunk_values: np.ndarray,
    locals_: Sequence[LocalCritical],
    cands: Sequence[CandidateEfficiency],
    *,
    reference: str,
    metric: str,
    target: float,
    higher_is_better: bool,
    tolerance: float = 0.1,
    confidence: float = 0.9,
    reference_curve: tuple[np.ndarray, np.ndarray] | None = None,
    notes: Sequence[str] = (),
    unread_samples: float = 0.0,
    unit: str = "samples",
    offpolicy: Sequence[OffPolicyInput] = (),
) -> BranchedSummary:
    """R(B) per candidate from the local ratios (module docstring), then the usual assessment.

    ``cands``: the candidates with their timings and costs (estimates are replaced); a candidate no
    checkpoint branched is left out with a note (it was not measured). ``reference_curve``: the
    longest curve of the reference batch (the trunk continued by its own seed's control), which
    R(B0) is read or extrapolated from; default the trunk itself. The trunk's cost is its own.
    ``notes`` (the caller's, e.g. a checkpoint it could not read) come first; ``unread_samples``:
    what such checkpoints' controls spent, counted with the branches. ``unit``: what samples count
    ("tokens" for a pre-training recipe), carried by the efficiency for its readers. ``offpolicy``:
    off-policy branches, each paired with its on-policy batch seed by seed (analysis/branched/offpolicy.py).
    """
    if not locals_:
        raise AnalysisError("a branched probe needs at least one checkpoint with finished branches")
    notes = list(notes)
    ref_s, ref_v = reference_curve if reference_curve is not None else (trunk_samples, trunk_values)
    (r0, lo0, hi0), extrapolated, note = _reference_samples(
        ref_s,
        ref_v,
        metric=metric,
        target=target,
        higher_is_better=higher_is_better,
        confidence=confidence,
        unit=unit,
    )
    notes += [note] if note else []
    w = segment_weights([lc.checkpoint_samples for lc in locals_], r0)
    out, seen, left_out = _estimates(cands, locals_, w, reference=reference, r0=r0, confidence=confidence)
    off, off_notes = offpolicy_estimates(offpolicy, seen, r0, confidence)
    out += off
    notes += left_out + off_notes
    eff = assess(
        out,
        metric=metric,
        target=target,
        higher_is_better=higher_is_better,
        tolerance=tolerance,
        confidence=confidence,
        reference=reference,
    )
    eff = dataclasses.replace(eff, notes=(*eff.notes, *notes), scale_ci=(lo0 / r0, hi0 / r0), unit=unit)
    progress, at_target, why_not = _progress_at_target(locals_, r0, confidence)
    if why_not is not None:
        eff = dataclasses.replace(eff, notes=(*eff.notes, why_not))
    return BranchedSummary(
        efficiency=eff,
        locals=tuple(locals_),
        trunk_samples=float(np.max(trunk_samples)),
        branch_samples=float(sum(lc.branch_samples for lc in locals_)) + unread_samples,
        reference_samples_to_target=(r0, lo0, hi0),
        extrapolated=extrapolated,
        progress=progress,
        critical_at_target=at_target,
        notes=tuple(notes),
    )


def with_schedule(rec: Recommendation, summary: BranchedSummary, tol: float) -> Recommendation:
    """``rec`` with the batch schedule of analysis/branched/schedule.py read from the branched probe's local
    ratios (the geometric mean over seeds at each checkpoint, censored seeds at their bounds, as
    the ranking reads them, on the ranking's segment weights), compared with every fixed batch that has a
    throughput; a note instead with fewer than two checkpoints before R(B0) (a checkpoint at or past
    where the reference reaches the target has no trunk left to schedule), or when no schedule can
    be predicted: the recommendation stands without one."""
    r0 = summary.reference_samples_to_target[0]
    w = segment_weights([lc.checkpoint_samples for lc in summary.locals], r0)
    before = [(wi, lc) for wi, lc in zip(w, summary.locals, strict=True) if lc.checkpoint_samples < r0]
    if len(before) < 2:
        note = (
            "no batch schedule: it needs the local ratios at >= 2 checkpoints before the reference "
            "reaches the target (branch.checkpoints)"
        )
        return dataclasses.replace(rec, notes=(*rec.notes, note))
    total = sum(wi for wi, _ in before)
    segments = [
        Segment(
            share=float(r0 * wi / total),
            ratios={  # the geometric mean over seeds, as the ranking reads them (censored at their bounds)
                b: float(stats.gmean([r for r, _ in seen.values()]))
                for b in lc.ratios
                if (seen := lc.observed(b))
            },
            local_critical=lc.point,
        )
        for wi, lc in before
    ]
    thr = rec.throughput.per_candidate
    cands = [
        ScheduleCandidate(c.label, c.prompts, c.group_size, c.lr, thr[c.label].responses_per_s)
        for c in rec.efficiency.candidates
        if c.family == "main" and c.label in thr
    ]
    try:
        cmp = compare_schedule(
            segments, cands, reference=rec.efficiency.reference, tol=tol, incumbent=rec.winner.label
        )
    except AnalysisError as exc:  # an optional extra: the recommendation stands without it
        return dataclasses.replace(rec, notes=(*rec.notes, f"no batch schedule: {exc}"))
    return dataclasses.replace(rec, schedule=cmp)
