"""`batchtune pretrain`: from pre-training loss curves a user already has (one run per batch size
and seed) to B_opt and B_min at each target loss, with brackets, checked fits and paired-seed
intervals (analysis/pretrain/batch.estimate_batches, through analysis/pretrain/grid.analyse_grid),
and a token-keyed batch schedule (docs/method.md §6, docs/pretraining.md).

Input: the runs of integrations/pretrain_logs.read_runs, one per batch and seed; runs are paired
across batches by their seed, or in name order without one. Each run's tokens are
``step * batch_tokens``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchtune.analysis.pretrain.grid import GridAnalysis, GridCurve, analyse_grid
from batchtune.errors import InputError


@dataclass(frozen=True)
class PretrainRun:
    name: str
    batch_tokens: float
    steps: np.ndarray
    loss: np.ndarray
    seed: int | None = None
    diverged_at: float | None = None  # the step of its first non-finite loss; the rows after it are dropped


@dataclass(frozen=True)
class PretrainAnalysis:
    """The grid analysis of the logs, and how their runs were paired into seeds."""

    grid: GridAnalysis
    runs: tuple[tuple[str, float, int], ...]  # (run, batch_tokens, seed index) of every run used
    notes: tuple[str, ...]


def pair_seeds(runs: Sequence[PretrainRun]) -> tuple[list[tuple[PretrainRun, int]], list[str]]:
    """(run, seed index) pairs: by the ``seed`` column where every run has one, else in name order
    within each batch. Batches with more runs than the fewest are cut to it (a paired bootstrap
    resamples whole seeds), with a note."""
    by_batch: dict[float, list[PretrainRun]] = defaultdict(list)
    for r in runs:
        by_batch[r.batch_tokens].append(r)
    keyed = all(r.seed is not None for r in runs)
    notes, out = [], []
    if keyed:
        common: set[int] = set.intersection(
            *({r.seed for r in rs if r.seed is not None} for rs in by_batch.values())
        )
        dropped = [r.name for r in runs if r.seed not in common]
        order = sorted(common)
        out = [(r, order.index(r.seed)) for r in runs if r.seed in common]
    else:
        n = min(len(rs) for rs in by_batch.values())
        dropped = []
        for rs in by_batch.values():
            rs = sorted(rs, key=lambda r: r.name)
            out += [(r, i) for i, r in enumerate(rs[:n])]
            dropped += [r.name for r in rs[n:]]
    if not out:
        raise InputError("no seed is shared by every batch: give each batch's runs the same seeds")
    if dropped:
        notes.append(
            f"left out {', '.join(sorted(dropped))}: seeds are paired across batches and not every "
            "batch has these"
        )
    return out, notes


def analyse(
    runs: Sequence[PretrainRun],
    targets: Sequence[float],
    *,
    base_lr: float,
    rule: str = "sqrt",
    confidence: float = 0.9,
) -> PretrainAnalysis:
    """B_opt and B_min per target (the grid estimators, docs/pretraining.md §5) and the schedule.

    Without targets, four levels between what most runs and what only the best runs reached."""
    empty = [r.name for r in runs if r.steps.size == 0]  # diverged before its first logged loss
    kept = [r for r in runs if r.steps.size]
    if empty and len({r.batch_tokens for r in kept}) < 3:
        raise InputError(
            f"need runs at 3 or more batch sizes; {', '.join(empty)} logged no finite loss after step 0 "
            "(diverged at once) and cannot be read"
        )
    paired, notes = pair_seeds(kept)
    if empty:
        notes.append(
            f"left out {', '.join(empty)}: no finite loss after step 0 (diverged at once); such a "
            "batch reached no target, which its table row cannot show"
        )
    notes = [
        *(
            f"run {r.name} diverged at step {r.diverged_at:g} (a non-finite loss): it counts as never "
            "reaching a loss it had not reached by then"
            for r, _ in paired
            if r.diverged_at is not None
        ),
        *notes,
    ]
    curves = [
        GridCurve(r.batch_tokens, seed, tuple(r.steps * r.batch_tokens), tuple(r.loss.astype(float)))
        for r, seed in paired
    ]
    grid = analyse_grid(curves, list(targets), base_lr=base_lr, rule=rule, confidence=confidence)
    used = tuple(sorted((r.name, r.batch_tokens, seed) for r, seed in paired))
    return PretrainAnalysis(grid, used, tuple(notes))
