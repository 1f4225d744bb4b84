"""From run records to sample efficiency: samples-to-target per candidate, the invariance verdicts,
the critical training batch and the gradient-noise diagnostics (docs/method.md §3).

Pure: takes records (plain dataclasses) and returns frozen results; no engine import.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from batchtune.analysis.sample.critical import CriticalBatch, critical_batch
from batchtune.analysis.sample.curves import (
    TargetCrossing,
    TargetEstimate,
    estimate_over_seeds,
    samples_to_target,
)
from batchtune.analysis.sample.evals import NO_EVALS, EvalCost, eval_cost
from batchtune.analysis.sample.noise import (
    GradNormSlope,
    NoiseScale,
    b_simple_two_batch,
    grad_norm_slope,
    grad_norms_at_matched_samples,
)
from batchtune.analysis.sample.ratio import Verdict, classify, ratio_to_reference
from batchtune.errors import AnalysisError, MetricMissingError, RunsFailed
from batchtune.records import FAILED_STATUSES, RunRecord, StepRecord

FAMILIES = ("main", "group_sweep", "fixed_lr", "offpolicy")  # offpolicy: -k{k}u{u} (plan.py)


@dataclass(frozen=True)
class RunData:
    record: RunRecord
    steps: tuple[StepRecord, ...]

    def curve(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        pts = [(s.samples, s.metrics[metric]) for s in self.steps if metric in s.metrics]
        if not pts:
            return np.empty(0), np.empty(0)
        arr = np.asarray(pts, dtype=float)
        return arr[:, 0], arr[:, 1]


@dataclass(frozen=True)
class CandidateEfficiency:
    label: str
    prompts: int
    group_size: int
    lr: float
    lr_rule: str
    family: str  # main | group_sweep | fixed_lr
    estimate: TargetEstimate | None  # None when no run of it finished usefully
    verdict: Verdict | None
    n_runs: int
    failures: tuple[str, ...]  # "seed 1: diverged (loss is nan)"
    gen_s_per_step: float  # medians over the steps of all its runs (measured while probing)
    train_s_per_step: float
    other_s_per_step: float
    samples_consumed: int  # what probing this candidate cost, all seeds
    wall_s: float
    critic_lr: float | None = None  # PPO: the critic's LR as the runs used it (carried, never re-planned)
    evals: EvalCost = NO_EVALS  # what one held-out evaluation cost its runs, and how often (evals.py)

    @property
    def batch_responses(self) -> int:
        return self.prompts * self.group_size

    @property
    def status(self) -> str:
        if self.estimate is None:
            return "failed"
        return self.verdict.status if self.verdict else "unknown"


def shape_header(unit: str) -> str:
    """The column head of a batch's shape: P x G, or sequences x length where samples are tokens."""
    return "seqs x len" if unit == "tokens" else "P x G"


@dataclass(frozen=True)
class SampleEfficiency:
    metric: str
    target: float
    higher_is_better: bool
    tolerance: float
    reference: str
    candidates: tuple[CandidateEfficiency, ...]
    critical: CriticalBatch | None
    grad_slope: GradNormSlope | None
    noise_scale: NoiseScale | None
    notes: tuple[str, ...]
    critic_grad_slope: GradNormSlope | None = None  # PPO: the critic's own batch scale (docs/method.md §3.5)
    extra_seeds: dict[str, int] = field(default_factory=dict)  # label -> sequential seeds added
    # a factor interval common to every candidate's absolute R: a branched probe's R(B0) extrapolated
    # from its trunk (R(B) = R(B0) x ratio). Ratios between candidates do not carry it.
    scale_ci: tuple[float, float] = (1.0, 1.0)
    # what a sample and a batch count: "samples" (responses) for RL; "tokens" for a pre-training
    # recipe's branched probe, where a batch is seqs x len tokens
    unit: str = "samples"

    @property
    def batch_noun(self) -> str:
        """How a batch size reads: "responses", or "tokens" for pre-training."""
        return "tokens" if self.unit == "tokens" else "responses"

    def shape_words(self, prompts: int, group_size: int) -> str:
        """A batch's shape in words: "8 prompts x 16 responses", or "8 sequences x 16 tokens"."""
        if self.unit == "tokens":
            return f"{prompts} sequences x {group_size} tokens"
        return f"{prompts} prompts x {group_size} responses"

    @property
    def shape_header(self) -> str:
        """The column head of a batch's shape: P x G, or sequences x length for pre-training."""
        return shape_header(self.unit)

    @property
    def rate_unit(self) -> str:
        """Throughput's unit: responses/s, or tokens/s for pre-training."""
        return "tok/s" if self.unit == "tokens" else "resp/s"

    def absolute_ci(self, est: TargetEstimate) -> tuple[float, float]:
        """``est``'s interval for R itself: the seeds' interval times ``scale_ci``."""
        return est.ci_low * self.scale_ci[0], est.ci_high * self.scale_ci[1]

    def get(self, label: str) -> CandidateEfficiency:
        for c in self.candidates:
            if c.label == label:
                return c
        raise KeyError(label)

    @property
    def total_samples(self) -> int:
        return sum(c.samples_consumed for c in self.candidates)

    @property
    def total_wall_s(self) -> float:
        return sum(c.wall_s for c in self.candidates)


def _family(label: str, record: RunRecord, main_g: int) -> str:
    if label.endswith("-fixedlr") or record.lr_rule == "none":
        return "fixed_lr"
    if re.search(r"-k\d+u\d+$", label):
        return "offpolicy"
    return "main" if record.group_size == main_g else "group_sweep"


def _median(values: Sequence[float]) -> float:
    return float(np.median(values)) if len(values) else 0.0


def _crossing(run: RunData, metric: str, target: float, higher: bool, ema_alpha: float) -> TargetCrossing:
    samples, values = run.curve(metric)
    if samples.size == 0:
        return TargetCrossing(samples_to_target=None, censored=True, max_samples=float(run.record.samples))
    crossing = samples_to_target(samples, values, target, higher_is_better=higher, ema_alpha=ema_alpha)
    # a run stopped by the probe may have consumed more than its last metric point: censor there
    if crossing.censored and run.record.samples > crossing.max_samples:
        return TargetCrossing(None, True, float(run.record.samples))
    return crossing


def failures_message(failed: Sequence[RunRecord], shown: int = 3) -> str:
    """'4 run(s) failed (2 diverged, 2 timeout): P8xG8-s0 diverged: ...; ...' with each distinct
    reason once (the first ``shown`` of them), so the user reads why rather than a count."""
    counts = Counter(r.status for r in failed)
    kinds = ", ".join(f"{n} {status}" for status, n in counts.most_common())
    seen: dict[str, str] = {}
    for r in failed:
        why = f": {r.reason}" if r.reason else ""
        seen.setdefault(r.reason or r.status, f"{r.run_id} {r.status}{why}")
    reasons = list(seen.values())
    more = f"; and {len(reasons) - shown} other reason(s) in run.json" if len(reasons) > shown else ""
    return f"{len(failed)} run(s) failed ({kinds}): " + "; ".join(reasons[:shown]) + more


def candidates_from_runs(
    runs: Sequence[RunData],
    *,
    metric: str,
    target: float,
    higher_is_better: bool = True,
    ema_alpha: float = 0.5,
    confidence: float = 0.9,
    families: dict[str, str] | None = None,
) -> list[CandidateEfficiency]:
    """Group runs by candidate and estimate samples-to-target over seeds (verdicts come later).

    Failed runs (diverged, OOM, ...) are reported, not estimated; runs that never reach the target
    are censored at the samples they consumed. ``families`` maps label -> main | group_sweep |
    fixed_lr (the probe's plan knows it); otherwise fixed-LR controls are recognised by their rule
    and the group sweep by a group size other than the most common one.
    """
    if not runs:
        raise AnalysisError("no runs to analyse: run `batchtune probe` or import logs first")
    by_label: dict[str, list[RunData]] = defaultdict(list)
    for run in runs:
        by_label[run.record.candidate].append(run)
    failed = [r.record for r in runs if r.record.status in FAILED_STATUSES]
    if len(failed) == len(runs):
        raise RunsFailed(f"every run failed, so nothing can be estimated: {failures_message(failed)}")
    if not any(metric in s.metrics for r in runs for s in r.steps):
        found = sorted({k for r in runs for s in r.steps for k in s.metrics})
        also = f"; besides, {failures_message(failed)}" if failed else ""
        raise MetricMissingError(  # bad input (exit 2), as when a probe's first evaluation lacks it
            f"no run logged the target metric {metric!r}; the runs have: {', '.join(found) or 'none'} "
            f"(set target.metric, e.g. --set target.metric=NAME){also}"
        )
    main_g = Counter(r.record.group_size for r in runs).most_common(1)[0][0]
    out = []
    for lab, group in by_label.items():
        rec0 = group[0].record
        usable = [r for r in group if r.record.status not in FAILED_STATUSES]
        failures = tuple(
            f"seed {r.record.seed}: {r.record.status}" + (f" ({r.record.reason})" if r.record.reason else "")
            for r in group
            if r.record.status in FAILED_STATUSES
        )
        estimate = None
        if usable:
            crossings = [_crossing(r, metric, target, higher_is_better, ema_alpha) for r in usable]
            estimate = estimate_over_seeds(
                crossings, confidence=confidence, seed_ids=[r.record.seed for r in usable]
            )
        steps = [s for r in group for s in r.steps if s.step > 0 or s.samples > 0]
        timed = [s for s in steps if s.timed] or steps  # untimed entries' zeros would pull them down
        out.append(
            CandidateEfficiency(
                label=lab,
                prompts=rec0.prompts,
                group_size=rec0.group_size,
                lr=rec0.lr,
                lr_rule=rec0.lr_rule,
                family=(families or {}).get(lab) or _family(lab, rec0, main_g),
                estimate=estimate,
                verdict=None,
                n_runs=len(group),
                failures=failures,
                gen_s_per_step=_median([s.gen_s for s in timed]),
                train_s_per_step=_median([s.train_s for s in timed]),
                other_s_per_step=_median([s.other_s for s in timed]),
                samples_consumed=sum(r.record.samples for r in group),
                wall_s=sum(r.record.wall_s for r in group),
                critic_lr=rec0.critic_lr,
                evals=eval_cost([r.steps for r in group], metric),
            )
        )
    return out


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
    cmap = {c.label: c for c in cands}
    main = sorted((c for c in cands if c.family == "main"), key=lambda c: c.batch_responses)
    if not main:
        raise AnalysisError("no main-sweep candidate (LR-scaled, common group size) to use as reference")
    ref_label = reference or main[0].label
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
    critical = None
    measured = [c for c in main if c.estimate is not None]
    ref_index = next((i for i, c in enumerate(measured) if c.label == ref_label), 0)
    try:
        critical = critical_batch(
            [c.batch_responses for c in measured],
            [c.estimate for c in measured if c.estimate is not None],
            reference_index=ref_index,
            tol=tolerance,
            confidence=confidence,
            failed_batches=[c.batch_responses for c in main if c.estimate is None],
        )
    except AnalysisError as exc:
        notes.append(f"critical batch not estimated: {exc}")
    verdicts: dict[str, Verdict] = {}
    if critical is not None:
        for c, v in zip(measured, critical.verdicts, strict=True):
            verdicts[c.label] = v
    for c in cands:
        if c.label in verdicts or c.estimate is None:
            continue
        if c.label == ref_label:
            verdicts[c.label] = Verdict(float(c.batch_responses), "reference", None, "the reference")
            continue
        ratio = ratio_to_reference(ref.estimate, c.estimate, confidence=confidence)
        status, reason = classify(ratio, tol=tolerance)
        verdicts[c.label] = Verdict(float(c.batch_responses), status, ratio, reason)
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
        reference=ref_label,
        candidates=result,
        critical=critical,
        grad_slope=slope,
        noise_scale=noise,
        notes=tuple(notes),
        critic_grad_slope=critic_slope,
    )


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
    return assess(
        cands,
        metric=metric,
        target=target,
        higher_is_better=higher_is_better,
        tolerance=tolerance,
        confidence=confidence,
        reference=reference,
        runs=runs,
    )


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
