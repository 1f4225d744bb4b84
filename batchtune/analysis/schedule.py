"""Batch-size schedules from the local critical batch against progress (pure; docs/method.md §6, §9).

The rule is Merrill et al. 2025's batch warmup ("Critical Batch Size Revisited", arXiv 2505.23971;
analysis/pretrain_schedule.merrill_batch_warmup): at each check, when the local critical batch passes
the next batch of the ladder (on a doubling ladder: twice the current batch), step up to it, at most
one step per check. Here the checks are dense points of the fitted curve B_crit(p)
(analysis/branched.ProgressFit, p = samples the reference batch B0 has consumed, the trunk's axis),
the ladder is the probe's candidate batches from B0 up, and the LR of every stage is the recipe's
rule at the stage's batch as the probe ran it (not Merrill's fixed sqrt(2)): SGD under the linear
rule gets lr * k.

Predicting what the schedule costs needs the samples a batch B spends per sample of B0 progress at p.
Between measured points we use McCandlish et al. 2018's form E(B) = E_min (1 + B / B_noise)
(docs/method.md §3.4), pinned by the local critical batch B_x(p) (where the ratio reaches 1 + tol):

    r(B, p) = (B_noise(p) + B) / (B_noise(p) + B0),   B_noise(p) = (B_x(p) - (1 + tol) B0) / tol

so R(schedule) = integral_0^R0 r(B(p), p) dp, steps = integral r / B dp, and the same integral at a
constant B gives each fixed batch, on the same footing. Time: samples of each stage divided by that
batch's predicted end-to-end throughput (analysis/throughput.predict_end_to_end, carried in the
caller's per-candidate responses_per_s). An extrapolation of B_crit past the last checkpoint is a
stated assumption (the fit's own interval says how loose); the stages are keyed in samples consumed
by the schedule itself, which is what a trainer counts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from batchtune.analysis.pretrain_schedule import merrill_batch_warmup
from batchtune.errors import AnalysisError

CHECKS = 256  # dense checks of the fitted curve, log-spaced over the run
GRID = 4000  # midpoints of the progress integral


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
    ``local_critical``: B_crit predicted there; ``time_s``: predicted seconds of the stage.
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
    """The schedule against the best fixed batch, both predicted by the same model (module docstring).

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

    def verdict(self) -> str:
        f = self.fixed[self.best_fixed]
        s = self.schedule
        if len(self.stages) == 1:
            return (
                f"no schedule: the local critical batch never passes the next batch after "
                f"{self.stages[0].label} before the target, so a fixed batch is the plan "
                f"(best: {self.best_fixed})"
            )
        pct = abs(1 - self.time_ratio) * 100
        how = "faster" if self.time_ratio < 1 else "slower"
        return (
            f"the schedule {' -> '.join(st.label for st in self.stages)} is predicted {pct:.0f}% {how} "
            f"than the best fixed batch {self.best_fixed} ({s.time_s:,.3g} s vs {f.time_s:,.3g} s; "
            f"{s.steps:,.0f} vs {f.steps:,.0f} steps, {s.samples:,.0f} vs {f.samples:,.0f} samples)"
        )


def local_ratio(batch: np.ndarray | float, b_crit: np.ndarray | float, reference_batch: float, tol: float):
    """r(B, p) = (B_noise + B) / (B_noise + B0) with B_noise from the 1+tol crossing (module docstring).

    B_noise is floored at 1e-9 B0: a local critical batch at or below (1 + tol) B0 means every step
    is worth about B0 samples of progress, whatever its size (r = B / B0)."""
    b_noise = np.maximum(
        (np.asarray(b_crit, dtype=float) - (1 + tol) * reference_batch) / tol, 1e-9 * reference_batch
    )
    return (b_noise + np.asarray(batch, dtype=float)) / (b_noise + reference_batch)


def plan_stages(
    crit_at: Callable[[np.ndarray], np.ndarray], ladder: Sequence[float], end_progress: float
) -> list[tuple[int, float, float]]:
    """(ladder index, start progress, B_crit there) per stage: Merrill's rule on a dense check grid.

    The ladder maps onto the doubling ladder 1, 2, 4, ... (batch ladder[j] -> 2^j, log-linear in
    between), so merrill_batch_warmup's "double when B_crit > 2 x batch" steps to ladder[j+1] exactly
    when B_crit passes it, on any increasing grid. A stage that would last less than one step of the
    next batch (in progress samples) is merged into it: the schedule starts where the curve allows."""
    lad = np.asarray(ladder, dtype=float)
    if lad.size == 0 or np.any(np.diff(lad) <= 0):
        raise AnalysisError(f"the schedule's batches must increase, got {lad.tolist()}")
    checks = np.geomspace(end_progress / 1000.0, end_progress, CHECKS)
    crit = crit_at(checks)
    out = [(0, 0.0, float(crit[0]))]
    if lad.size == 1:
        return out
    # one rung past the top (twice it) so that passing the top batch itself is a doubling
    ext = np.r_[lad, 2.0 * lad[-1]]
    idx = np.interp(np.log(np.maximum(crit, 1e-300)), np.log(ext), np.arange(ext.size))
    steps = merrill_batch_warmup(2.0**idx, 1.0, 1.0, at_tokens=checks)
    for st, c in zip(steps, crit, strict=True):
        j = int(round(math.log2(st.batch)))
        if st.doubled and j < lad.size:
            at = float(st.at_tokens or 0.0)
            if at - out[-1][1] < lad[j]:  # under one step of the new batch: merge
                out[-1] = (j, out[-1][1], out[-1][2])
            else:
                out.append((j, at, float(c)))
    return out


def _integrate(
    batch_of: Callable[[np.ndarray], np.ndarray],
    crit_at: Callable[[np.ndarray], np.ndarray],
    end_progress: float,
    reference_batch: float,
    tol: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Midpoints p, the batch there and d(samples)/dp along [0, end_progress]."""
    dp = end_progress / GRID
    p = (np.arange(GRID) + 0.5) * dp
    b = batch_of(p)
    return p, b, local_ratio(b, crit_at(p), reference_batch, tol) * dp


def compare_schedule(
    crit_at: Callable[[np.ndarray], np.ndarray],
    candidates: Sequence[ScheduleCandidate],
    *,
    reference: str,
    end_progress: float,
    tol: float,
    last_measured_progress: float | None = None,
) -> ScheduleComparison:
    """The schedule from ``crit_at`` (B_crit against B0-progress, e.g. ProgressFit.predict's point)
    over the candidates from the reference up, and every fixed candidate, to ``end_progress`` = R(B0).

    Each stage's LR is its candidate's: the recipe's rule at that batch, as the probe ran it.
    ``last_measured_progress``: the last checkpoint; a switch past it is flagged as extrapolated."""
    if not (math.isfinite(end_progress) and end_progress > 0):
        raise AnalysisError(f"R(B0) must be finite and > 0 to plan a schedule, got {end_progress}")
    by = {c.label: c for c in candidates}
    if reference not in by:
        raise AnalysisError(f"the reference {reference} is not among the schedule's candidates")
    b0 = float(by[reference].batch_responses)
    ladder = sorted(
        (c for c in candidates if c.batch_responses >= b0 and c.responses_per_s > 0),
        key=lambda c: c.batch_responses,
    )
    plan = plan_stages(crit_at, [c.batch_responses for c in ladder], end_progress)
    starts = np.array([p for _, p, _ in plan])
    sizes = np.array([ladder[j].batch_responses for j, _, _ in plan], dtype=float)

    def batch_of(p: np.ndarray) -> np.ndarray:
        return sizes[np.searchsorted(starts, p, side="right") - 1]

    p, b, ds = _integrate(batch_of, crit_at, end_progress, b0, tol)
    cum = np.r_[0.0, np.cumsum(ds)]
    edges = np.r_[0.0, p + end_progress / GRID / 2]
    stages: list[BatchStage] = []
    for k, (j, start_p, crit) in enumerate(plan):
        c = ladder[j]
        end_p = plan[k + 1][1] if k + 1 < len(plan) else end_progress
        s0, s1 = float(np.interp(start_p, edges, cum)), float(np.interp(end_p, edges, cum))
        stages.append(
            BatchStage(
                c.label, c.prompts, c.group_size, c.lr, s0, s1, start_p, crit, (s1 - s0) / c.responses_per_s
            )
        )
    sched = Outcome(float(cum[-1]), float(np.sum(ds / b)), float(sum(st.time_s for st in stages)))
    fixed: dict[str, Outcome] = {}
    for c in candidates:
        if c.responses_per_s <= 0:
            continue
        n = float(c.batch_responses)
        _, _, dsf = _integrate(functools.partial(_constant, n), crit_at, end_progress, b0, tol)
        total = float(np.sum(dsf))
        fixed[c.label] = Outcome(total, total / n, total / c.responses_per_s)
    best = min(fixed, key=lambda k: fixed[k].time_s)
    notes = []
    late = [
        st
        for st in stages[1:]
        if last_measured_progress is not None and st.start_progress > last_measured_progress
    ]
    if late:
        notes.append(
            f"the switch{'es' if len(late) > 1 else ''} to {', '.join(st.label for st in late)} lie past the "
            "last checkpoint: they rest on the extrapolated critical batch (its interval is the fit's)"
        )
    return ScheduleComparison(
        stages=tuple(stages),
        schedule=sched,
        best_fixed=best,
        fixed=fixed,
        time_ratio=sched.time_s / fixed[best].time_s,
        steps_ratio=sched.steps / fixed[best].steps,
        end_progress=float(end_progress),
        notes=tuple(notes),
    )


def _constant(value: float, q: np.ndarray) -> np.ndarray:
    """A fixed batch as a schedule: ``value`` at every point of ``q``."""
    return np.full_like(q, value)
