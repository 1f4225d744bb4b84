"""Judging candidates: invariance verdicts against the reference, the critical training batch and the
gradient-noise diagnostics (docs/method.md §3.2-3.3); ``analyse_runs`` goes from runs to the whole
``SampleEfficiency``.

Pure: takes records (plain dataclasses) and returns frozen results; no engine import.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from batchtune.analysis.sample.candidates import candidates_from_runs
from batchtune.analysis.sample.critical import CriticalBatch, critical_batch
from batchtune.analysis.sample.efficiency import FAMILIES, CandidateEfficiency, RunData, SampleEfficiency
from batchtune.analysis.sample.noise import (
    GradNormSlope,
    NoiseScale,
    b_simple_two_batch,
    grad_norm_slope,
    grad_norms_at_matched_samples,
)
from batchtune.analysis.sample.ratio import INCONCLUSIVE, Verdict, classify, ratio_to_reference
from batchtune.errors import AnalysisError
from batchtune.records.types import FAILED_STATUSES


def assess(
    cands: Sequence[CandidateEfficiency],
    *,
    metric: str,
    target: float,
    higher_is_better: bool = True,
    tolerance: float = 0.1,
    confidence: float = 0.9,
    reference: str | None = None,
    runs: Sequence[RunData] = (),
) -> SampleEfficiency:
    """Invariance verdicts against the reference and the critical training batch (docs/method.md §3.2).

    The critical batch is judged on the main sweep; group-sweep and fixed-LR candidates get a
    verdict against the same reference. ``runs`` (optional) feed the gradient-norm diagnostics.
    """
    notes: list[str] = []
    main = sorted((c for c in cands if c.family == "main"), key=lambda c: c.batch_responses)
    if not main:
        raise AnalysisError("no main-sweep candidate (LR-scaled, common group size) to use as reference")
    ref = _reference(cands, reference or main[0].label, metric, target, higher_is_better, notes)
    measured = [c for c in main if c.estimate is not None]
    critical = _critical(main, measured, ref.label, tolerance, confidence, notes)
    verdicts = _verdicts(cands, measured, critical, ref, tolerance, confidence)
    ordered = sorted(cands, key=lambda c: (FAMILIES.index(c.family), c.batch_responses, c.label))
    result = tuple(dataclasses.replace(c, verdict=verdicts.get(c.label)) for c in ordered)
    slope, noise = _gradient_diagnostics(runs, {c.label for c in main}, notes)
    critic_slope = None
    if any(s.critic_grad_norm is not None for r in runs for s in r.steps):
        critic_notes: list[str] = []
        critic_slope, _ = _gradient_diagnostics(
            runs, {c.label for c in main}, critic_notes, attr="critic_grad_norm"
        )
        notes.extend(f"critic: {n}" for n in critic_notes)
    return SampleEfficiency(
        metric=metric,
        target=target,
        higher_is_better=higher_is_better,
        tolerance=tolerance,
        reference=ref.label,
        candidates=result,
        critical=critical,
        grad_slope=slope,
        noise_scale=noise,
        notes=tuple(notes),
        critic_grad_slope=critic_slope,
    )


def _reference(
    cands: Sequence[CandidateEfficiency],
    ref_label: str,
    metric: str,
    target: float,
    higher_is_better: bool,
    notes: list[str],
) -> CandidateEfficiency:
    """The reference candidate, refused when nothing can be compared to it; a note when it never
    reached the target."""
    cmap = {c.label: c for c in cands}
    if ref_label not in cmap:
        raise AnalysisError(
            f"reference {ref_label!r} is not among the candidates ({', '.join(sorted(cmap))})"
        )
    ref = cmap[ref_label]
    if ref.estimate is None:
        raise AnalysisError(
            f"every run of the reference {ref_label} failed ({'; '.join(ref.failures)}); "
            "lower the base LR or the reference batch and probe again"
        )
    if ref.estimate.samples_to_target <= 0:  # met by the first evaluation: R/R0 divides by 0
        raise AnalysisError(
            f"the reference {ref_label} meets {metric} {'>=' if higher_is_better else '<='} {target} "
            "before it trains (at its first evaluation), so no batch can be compared: set a target the "
            "untrained model does not reach (target.value)"
        )
    if math.isinf(ref.estimate.samples_to_target):
        notes.append(
            f"the reference {ref_label} never reached {metric} {'>=' if higher_is_better else '<='} "
            f"{target}: lower the target or raise budget.max_samples"
        )
    return ref


def _critical(
    main: list[CandidateEfficiency],
    measured: list[CandidateEfficiency],
    ref_label: str,
    tolerance: float,
    confidence: float,
    notes: list[str],
) -> CriticalBatch | None:
    """The critical batch of the main sweep's measured candidates (None, with a note, when it cannot
    be estimated); the main sweep's failed batches bound it."""
    ref_index = next((i for i, c in enumerate(measured) if c.label == ref_label), 0)
    try:
        return critical_batch(
            [c.batch_responses for c in measured],
            [c.estimate for c in measured if c.estimate is not None],
            reference_index=ref_index,
            tol=tolerance,
            confidence=confidence,
            failed_batches=[c.batch_responses for c in main if c.estimate is None],
        )
    except AnalysisError as exc:
        notes.append(f"critical batch not estimated: {exc}")
        return None


def _verdicts(
    cands: Sequence[CandidateEfficiency],
    measured: list[CandidateEfficiency],
    critical: CriticalBatch | None,
    ref: CandidateEfficiency,
    tolerance: float,
    confidence: float,
) -> dict[str, Verdict]:
    """Each measured candidate's verdict: the critical batch's for the main sweep, else its own ratio
    to the reference."""
    verdicts: dict[str, Verdict] = {}
    if critical is not None:
        for c, v in zip(measured, critical.verdicts, strict=True):
            verdicts[c.label] = v
    assert ref.estimate is not None  # _reference refused one without
    for c in cands:
        if c.label in verdicts or c.estimate is None:
            continue
        if c.label == ref.label:
            verdicts[c.label] = Verdict(float(c.batch_responses), "reference", None, "the reference")
            continue
        if math.isinf(ref.estimate.samples_to_target):  # as the main sweep's (critical.py): no ratio
            why = f"reference batch {ref.batch_responses:g} never reached the target (R0 = inf)"
            verdicts[c.label] = Verdict(float(c.batch_responses), INCONCLUSIVE, None, why)
            continue
        ratio = ratio_to_reference(ref.estimate, c.estimate, confidence=confidence)
        status, reason = classify(ratio, tol=tolerance)
        verdicts[c.label] = Verdict(float(c.batch_responses), status, ratio, reason)
    return verdicts


def analyse_runs(
    runs: Sequence[RunData],
    *,
    metric: str,
    target: float,
    higher_is_better: bool = True,
    tolerance: float = 0.1,
    ema_alpha: float = 0.5,
    confidence: float = 0.9,
    reference: str | None = None,
    families: dict[str, str] | None = None,
) -> SampleEfficiency:
    """Estimate R(B) for every candidate and test invariance against the reference (docs/method.md §3.2)."""
    cands = candidates_from_runs(
        runs,
        metric=metric,
        target=target,
        higher_is_better=higher_is_better,
        ema_alpha=ema_alpha,
        confidence=confidence,
        families=families,
    )
    eff = assess(
        cands,
        metric=metric,
        target=target,
        higher_is_better=higher_is_better,
        tolerance=tolerance,
        confidence=confidence,
        reference=reference,
        runs=runs,
    )
    imported = bool(runs) and all(r.record.imported for r in runs)
    return dataclasses.replace(eff, imported=True) if imported else eff


def _gradient_diagnostics(
    runs: Sequence[RunData], main_labels: set[str], notes: list[str], attr: str = "grad_norm"
) -> tuple[GradNormSlope | None, NoiseScale | None]:
    """Gradient-norm slope at matched samples, and B_simple from the first step of each batch.

    Every probe run starts from the same weights, so the first step's gradients of two batches are
    taken at the same parameters: exactly the two-batch estimator's setting (docs/method.md §3.3).
    """
    series = []
    first: dict[float, list[float]] = defaultdict(list)
    for run in runs:
        if run.record.candidate in main_labels and run.record.status not in FAILED_STATUSES:
            pts = [(s.samples, getattr(s, attr)) for s in run.steps if getattr(s, attr) is not None]
            if not pts:
                continue
            arr = np.asarray(pts, dtype=float)
            if not np.all(np.isfinite(arr)):
                continue
            n = float(run.record.prompts * run.record.group_size)
            series.append((n, arr[:, 0], arr[:, 1]))
            first[n].append(float(arr[0, 1]) ** 2)
    slope = noise = None
    if len({s[0] for s in series}) >= 2:
        last = min(float(s[1][-1]) for s in series)
        earliest = max(float(s[1][0]) for s in series)
        at = max(earliest, 0.5 * last)  # inside every run's logged range when one exists
        try:
            batches, norms = grad_norms_at_matched_samples(series, at)
            slope = grad_norm_slope(batches, norms)
        except AnalysisError as exc:
            notes.append(f"gradient-norm slope not estimated: {exc}")
    if len(first) >= 2:
        small, big = min(first), max(first)
        try:
            noise = b_simple_two_batch(small, np.mean(first[small]), big, np.mean(first[big]))
        except AnalysisError as exc:
            notes.append(f"gradient noise scale not estimated: {exc}")
    return slope, noise
