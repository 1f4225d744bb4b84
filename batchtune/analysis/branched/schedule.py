"""Batch-size schedules from the branched probe's measured local ratios (pure; docs/branched.md).

A branched probe measures, at each checkpoint i of the trunk, the local ratio r_i(B) = R_c(B) /
R_c(B0): the samples batch B spends per sample of the reference batch's progress there
(analysis/branched/ratios.py). The ranking reads R(B) at the final target as R(B0) times the weighted mean
of those ratios over the trunk's segments (analysis/branched/summary.py), each checkpoint standing
for its segment's share of the run. A schedule is the same sum with the batch allowed to change
between segments:

    samples = sum_i share_i * r_i(B_i),    time = sum_i share_i * r_i(B_i) / throughput(B_i),

so a fixed batch predicted this way is exactly the ranking's R(B) (a batch a checkpoint did not
branch counts there at its mean over the checkpoints that did, which is what the ranking assumes),
and the schedule and every fixed batch are compared on one footing with the recommendation.

The plan starts from the recommended fixed batch (the ranking's winner; else the fixed batch of
least predicted time). In a segment where another batch that checkpoint measured is faster per unit
of progress by more than 1+tol, that batch is preferred there (a smaller gain is within the noise of
the ratios, and the minimum of noisy ratios per segment would flatter the schedule). The plan is a
warmup, as Merrill et al. 2025 ("Critical Batch Size Revisited", arXiv 2505.23971) run it: the batch
never falls, so the last stage is the larger of the recommended batch and the last segment's
preference, and an earlier segment that prefers a batch larger than a later segment's keeps the
later one. Where the local critical batch grows, that is small batches while large ones fall behind
and larger ones once they keep up; the LR of every stage is
the recipe's rule at that batch, as the probe ran it. The last segment runs to the target on the last
checkpoint's ratios, as the ranking does: a switch can only happen at a checkpoint, and nothing past
the last one is extrapolated. Stages are keyed in samples consumed by the schedule itself, which is
what a trainer counts.

An earlier planner applied Merrill's doubling rule to the local critical batch fitted against
progress and extrapolated to the target; on tiny-grpo its fixed-batch predictions were 2.8-3.6x the
measured samples and its best fixed batch differed from the ranking's (docs/branched.md), so the
schedule is now read from the measured ratios themselves.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from batchtune.errors import AnalysisError


@dataclass(frozen=True)
class ScheduleCandidate:
    """A batch the schedule may use: its label, size, LR under the recipe's rule and throughput."""

    label: str
    prompts: int
    group_size: int
    lr: float
    responses_per_s: float

    @property
    def batch_responses(self) -> int:
        return self.prompts * self.group_size


@dataclass(frozen=True)
class BatchStage:
    """One stage: from ``start_samples`` (consumed by the schedule) to ``end_samples``, batch and LR.

    ``start_progress``: the same point in samples of the reference batch (the probe's axis);
    ``local_critical``: the local critical batch measured at the checkpoint the stage starts from;
    ``time_s``: predicted seconds of the stage.
    """

    label: str
    prompts: int
    group_size: int
    lr: float
    start_samples: float
    end_samples: float
    start_progress: float
    local_critical: float
    time_s: float

    @property
    def batch_responses(self) -> int:
        return self.prompts * self.group_size

    @property
    def steps(self) -> float:
        return (self.end_samples - self.start_samples) / self.batch_responses


@dataclass(frozen=True)
class Outcome:
    """Predicted samples, optimiser steps and seconds to the target of one plan (schedule or fixed)."""

    samples: float
    steps: float
    time_s: float


@dataclass(frozen=True)
class ScheduleComparison:
    """The schedule against the fixed batch it starts from, both predicted by the same model (module
    docstring). ``best_fixed``: that batch (the ranking's winner when the caller gives it);
    ``time_ratio`` = schedule / best fixed (< 1: the schedule wins); ``fixed`` holds every candidate.
    """

    stages: tuple[BatchStage, ...]
    schedule: Outcome
    best_fixed: str
    fixed: dict[str, Outcome]
    time_ratio: float
    steps_ratio: float
    end_progress: float
    notes: tuple[str, ...] = ()

    @property
    def winner(self) -> str:
        return "schedule" if self.time_ratio < 1.0 else self.best_fixed

    def verdict(self, unit: str = "samples") -> str:
        """Which wins and by how much, in words; ``unit``: what samples count ("tokens")."""
        f = self.fixed[self.best_fixed]
        s = self.schedule
        if len(self.stages) == 1:
            return (
                f"no schedule: no checkpoint calls for a warmup (a smaller batch early or a larger one "
                f"late, faster per unit of progress than {self.best_fixed} by more than 1+tol), so a "
                f"fixed batch is the plan (best: {self.best_fixed})"
            )
        pct = abs(1 - self.time_ratio) * 100
        how = "faster" if self.time_ratio < 1 else "slower"
        return (
            f"the schedule {' -> '.join(st.label for st in self.stages)} is predicted {pct:.0f}% {how} "
            f"than the best fixed batch {self.best_fixed} ({s.time_s:,.3g} s vs {f.time_s:,.3g} s; "
            f"{s.steps:,.0f} vs {f.steps:,.0f} steps, {s.samples:,.0f} vs {f.samples:,.0f} {unit})"
        )


@dataclass(frozen=True)
class Segment:
    """What one checkpoint stands for: ``share`` of R(B0) (samples of reference progress), the local
    ratio of every batch it branched (batch in responses -> ratio, inf where it fell behind for good;
    the reference is 1) and its local critical batch."""

    share: float
    ratios: Mapping[float, float]
    local_critical: float


def _rates(
    segments: Sequence[Segment], by: Mapping[str, ScheduleCandidate], b0: float
) -> tuple[dict[str, list[float]], dict[str, list[bool]]]:
    """Per label, its ratio at each segment (where its checkpoint did not branch it, its mean over
    those that did) and whether it was measured there; a batch no checkpoint branched is left out."""
    rate: dict[str, list[float]] = {}
    known: dict[str, list[bool]] = {}
    for c in by.values():
        n = float(c.batch_responses)
        vals = [1.0 if n == b0 else seg.ratios.get(n, math.nan) for seg in segments]
        ok = [not math.isnan(v) for v in vals]
        if not any(ok):
            continue  # never branched: the ranking leaves it out too
        mean = sum(s.share * v for s, v, k in zip(segments, vals, ok, strict=True) if k) / sum(
            s.share for s, k in zip(segments, ok, strict=True) if k
        )
        rate[c.label] = [v if k else mean for v, k in zip(vals, ok, strict=True)]
        known[c.label] = ok
    return rate, known


def _outcome(
    plan: Sequence[str],
    segments: Sequence[Segment],
    rate: Mapping[str, list[float]],
    by: Mapping[str, ScheduleCandidate],
) -> Outcome:
    """Samples, steps and seconds of ``plan`` (a label per segment)."""
    samples = [s.share * rate[lab][i] for i, (s, lab) in enumerate(zip(segments, plan, strict=True))]
    steps = sum(x / by[lab].batch_responses for x, lab in zip(samples, plan, strict=True))
    secs = sum(x / by[lab].responses_per_s for x, lab in zip(samples, plan, strict=True))
    return Outcome(float(sum(samples)), float(steps), float(secs))


def _warmup_plan(
    rate: Mapping[str, list[float]],
    known: Mapping[str, list[bool]],
    by: Mapping[str, ScheduleCandidate],
    best: str,
    tol: float,
) -> list[str]:
    """A label per segment: the batch that segment measured fastest per unit of progress when it
    beats ``best`` by more than 1+tol, else ``best``; then made a warmup (module docstring)."""

    def per_progress(lab: str, i: int) -> float:
        return rate[lab][i] / by[lab].responses_per_s

    plan = []
    for i in range(len(rate[best])):
        here = [lab for lab in rate if known[lab][i]]
        fastest = min(here, key=lambda lab: per_progress(lab, i), default=best)
        plan.append(fastest if per_progress(fastest, i) * (1 + tol) < per_progress(best, i) else best)
    # a warmup: the batch never falls. The last stage is at least the incumbent, and an earlier
    # segment that prefers a larger batch than a later one keeps the later one's
    size = {lab: by[lab].batch_responses for lab in rate}
    plan[-1] = max(plan[-1], best, key=lambda lab: size[lab])
    for i in range(len(plan) - 2, -1, -1):
        plan[i] = min(plan[i], plan[i + 1], key=lambda lab: size[lab])
    return plan


def _stages(
    segments: Sequence[Segment],
    plan: Sequence[str],
    rate: Mapping[str, list[float]],
    by: Mapping[str, ScheduleCandidate],
) -> tuple[list[BatchStage], float]:
    """The plan as stages (consecutive segments of one batch merged) and the progress it ends at."""
    stages: list[BatchStage] = []
    done = progress = 0.0
    for i, (seg, lab) in enumerate(zip(segments, plan, strict=True)):
        c = by[lab]
        spent = seg.share * rate[lab][i]
        if stages and stages[-1].label == lab:
            last = stages[-1]
            stages[-1] = dataclasses.replace(
                last, end_samples=done + spent, time_s=last.time_s + spent / c.responses_per_s
            )
        else:
            stages.append(
                BatchStage(
                    lab,
                    c.prompts,
                    c.group_size,
                    c.lr,
                    done,
                    done + spent,
                    progress,
                    seg.local_critical,
                    spent / c.responses_per_s,
                )
            )
        done += spent
        progress += seg.share
    return stages, progress


def compare_schedule(
    segments: Sequence[Segment],
    candidates: Sequence[ScheduleCandidate],
    *,
    reference: str,
    tol: float,
    incumbent: str | None = None,
) -> ScheduleComparison:
    """The schedule over ``segments`` (in trunk order) and every fixed candidate with a throughput,
    predicted from the measured ratios (module docstring).

    ``incumbent``: the fixed batch the schedule starts from and is compared with (the ranking's
    winner, so that the schedule departs from the recommendation only where a checkpoint says so);
    default, or when it has no finite prediction here, the fixed batch of least predicted time."""
    if not segments or any(not (math.isfinite(s.share) and s.share > 0) for s in segments):
        raise AnalysisError("a schedule needs segments with a finite, positive share of R(B0)")
    by = {c.label: c for c in candidates if c.responses_per_s > 0}
    if reference not in by:
        raise AnalysisError(f"the reference {reference} is not among the schedule's candidates")
    rate, known = _rates(segments, by, float(by[reference].batch_responses))
    fixed = {lab: _outcome([lab] * len(segments), segments, rate, by) for lab in rate}
    finite = [lab for lab in fixed if math.isfinite(fixed[lab].time_s)]
    if not finite:
        raise AnalysisError("no candidate has a finite predicted time: nothing to schedule")
    best = incumbent if incumbent in finite else min(finite, key=lambda lab: fixed[lab].time_s)
    plan = _warmup_plan(rate, known, by, best, tol)
    sched = _outcome(plan, segments, rate, by)
    stages, progress = _stages(segments, plan, rate, by)
    f = fixed[best]
    return ScheduleComparison(
        stages=tuple(stages),
        schedule=sched,
        best_fixed=best,
        fixed=fixed,
        time_ratio=sched.time_s / f.time_s,
        steps_ratio=sched.steps / f.steps,
        end_progress=float(progress),
    )
