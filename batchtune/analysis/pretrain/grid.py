"""A grid of pre-training runs (batches in tokens x seeds) -> per target loss: steps and tokens to
target per batch, B_opt and B_min with brackets, fits and intervals (pretrain_batch.py), and a
token-keyed batch schedule that never shrinks and never leaves the measured range unannounced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchtune.analysis.pretrain.batch import BatchEstimate, estimate_batches, plateaued
from batchtune.analysis.pretrain.schedule import ScheduleStage, schedule_from_bopt
from batchtune.analysis.sample.curves import samples_to_target
from batchtune.analysis.sample.lr import scaled_lr
from batchtune.errors import AnalysisError, RecipeError


@dataclass(frozen=True)
class GridCurve:
    """One run's eval loss against tokens trained."""

    batch_tokens: float
    seed: int
    tokens: tuple[float, ...]
    loss: tuple[float, ...]


@dataclass(frozen=True)
class GridAnalysis:
    estimates: tuple[BatchEstimate, ...]  # one per target, from the easiest (highest) loss down
    schedule: tuple[ScheduleStage, ...]
    schedule_notes: tuple[str, ...]
    loss_floor: float | None  # the data's Bayes loss when known (synthetic Markov language)

    def unreached(self) -> str | None:
        """Why nothing could be estimated when no batch reached any target loss (None when one did):
        `pretrain` and a pre-training probe then exit 3 after showing the table."""
        if any(math.isfinite(t) for e in self.estimates for t in e.tokens_to_target):
            return None
        levels = ", ".join(f"{e.target_loss:g}" for e in self.estimates)
        return (
            f"no batch reached any target loss ({levels}), so neither B_opt nor B_min is estimated; "
            "give higher target losses or longer runs"
        )


def default_targets(curves: Sequence[GridCurve], n: int = 4) -> list[float]:
    """``n`` losses between what every run reached and what only the best runs reached."""
    finals = np.array([min(c.loss) for c in curves if c.loss])
    if finals.size == 0:
        raise AnalysisError("no eval losses in these runs")
    lo, hi = np.percentile(finals, [15, 85])
    return [float(x) for x in np.round(np.linspace(hi, lo, n), 3)]


def analyse_grid(
    curves: Sequence[GridCurve],
    targets: Sequence[float],
    *,
    base_lr: float,
    rule: str = "sqrt",
    confidence: float = 0.9,
    loss_floor: float | None = None,
    lr_batch: float | None = None,
) -> GridAnalysis:
    """Per target, B_opt and B_min; then the schedule, its LRs by ``rule`` from ``base_lr`` at
    ``lr_batch`` tokens (None: ``base_lr`` is the LR of the schedule's first stage)."""
    batches = sorted({c.batch_tokens for c in curves})
    seeds = sorted({c.seed for c in curves})
    if len(batches) < 3:
        raise AnalysisError(f"need runs at >= 3 batches, got {batches}")
    levels = sorted(targets or default_targets(curves), reverse=True)
    estimates = []
    for target in levels:
        steps = np.full((len(seeds), len(batches)), np.inf)
        flat = np.zeros_like(steps, dtype=bool)
        ran = np.zeros_like(steps, dtype=bool)  # more seeds run beside B_opt (refinement seed rounds)
        for c in curves:
            i, j = seeds.index(c.seed), batches.index(c.batch_tokens)
            ran[i, j] = True
            cross = samples_to_target(c.tokens, c.loss, target, higher_is_better=False)
            if cross.censored or cross.samples_to_target is None:
                flat[i, j] = plateaued(c.tokens, c.loss, target)
            else:
                steps[i, j] = float(cross.samples_to_target) / c.batch_tokens
        estimates.append(
            estimate_batches(
                batches, steps, target, confidence=confidence, plateaued_per_seed=flat, ran_per_seed=ran
            )
        )
    schedule, notes = schedule_from_estimates(estimates, batches, base_lr, rule, lr_batch=lr_batch)
    return GridAnalysis(tuple(estimates), schedule, notes, loss_floor)


def schedule_from_estimates(
    estimates: Sequence[BatchEstimate],
    batches: Sequence[float],
    base_lr: float,
    rule: str,
    *,
    lr_batch: float | None = None,
) -> tuple[tuple[ScheduleStage, ...], tuple[str, ...]]:
    """Stage k uses B_opt of target k from where the tokens to target k-1 (at its B_opt) are spent.

    ``base_lr`` belongs to ``lr_batch`` tokens (a probe's LR at its smallest batch), so the first
    stage runs at ``rule``'s LR for its own batch; None: ``base_lr`` is the first stage's LR.

    B_opt is held at least at the previous stage's batch (a schedule never shrinks as the loss
    falls: Zhou et al. 2026) and clipped to the measured batches; each adjustment is noted.
    """
    lo, hi = min(batches), max(batches)
    starts: list[float] = []
    values: list[float] = []
    notes: list[str] = []
    start = 0.0
    for est in estimates:
        b = est.b_opt_tokens
        if b is None or est.e_min_tokens is None:
            notes.append(f"loss {est.target_loss:g}: no batch reached it; no stage")
            continue
        if b < lo or b > hi:
            notes.append(
                f"loss {est.target_loss:g}: B_opt {b:.4g} outside the measured {lo:g}..{hi:g}; clipped"
            )
            b = min(max(b, lo), hi)
        if values and b < values[-1]:
            notes.append(
                f"loss {est.target_loss:g}: B_opt {b:.4g} below the previous stage's {values[-1]:.4g}; held"
            )
            b = values[-1]
        if (
            est.b_opt_source == "measured"
            and est.b_opt_bracket
            and est.b_opt_bracket[0] == est.b_opt_bracket[1]
        ):
            notes.append(
                f"loss {est.target_loss:g}: B_opt at the edge of the grid; the true one may lie beyond"
            )
        if starts and start <= starts[-1]:
            start = starts[-1] + 1.0
        starts.append(start)
        values.append(b)
        start = max(start, est.e_min_tokens)
    if not values:
        return (), tuple(notes)
    if lr_batch is not None:  # the LR rules have one home, analysis/sample/lr.py
        try:
            base_lr = scaled_lr(base_lr, values[0], lr_batch, rule)
        except RecipeError as exc:
            raise AnalysisError(str(exc)) from exc
    stages = schedule_from_bopt(starts, values, base_lr, rule)
    merged = [stages[0]]
    for s in stages[1:]:  # consecutive stages at one batch are one stage
        if not math.isclose(s.batch_tokens, merged[-1].batch_tokens):
            merged.append(s)
    return tuple(merged), tuple(notes)
