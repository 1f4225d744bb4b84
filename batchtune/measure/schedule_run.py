"""Run a batch schedule to the target (`analysis/branched/schedule.py` plans it; this measures it).

A schedule is a chain of ordinary runs, as a trainer without an in-run batch change would do it:
stage i trains candidate B_i from the previous stage's checkpoint (model, optimiser, data position)
until the schedule's cumulative samples reach the stage's end, saving a checkpoint there; the last
stage runs until the target or ``budget.max_samples``. Every stage stops as soon as the smoothed
metric reaches the target (the probe's stop rule). A fixed batch is the one-stage schedule. Needs a
backend with checkpoints (NQM, the built-in GRPO/PPO and pre-training trainers). Runs live under
``<results_dir>/<tag>-s<seed>-st<i>-<label>`` and are sealed like probe runs: a rerun reuses
finished stages (kill -9 safe).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchtune import backends
from batchtune.analysis.sample.curves import samples_to_target
from batchtune.analysis.sample.efficiency import RunData
from batchtune.backends.spec import Candidate, checkpoint_path
from batchtune.errors import InputError
from batchtune.measure.one_run import execute_run
from batchtune.measure.stop_rule import StopPolicy
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore
from batchtune.records.types import FAILED_STATUSES, StepRecord


@dataclass(frozen=True)
class ScheduleRun:
    """One seed of a schedule (or fixed batch) run to the target, measured.

    ``samples_to_target``: the isotonic crossing of the whole chain's curve (None: never reached, then
    ``censored_at`` samples); ``steps_to_target`` and ``time_to_target_s`` count the steps up to that
    crossing and their gen_s + train_s + other_s (simulated seconds on the NQM)."""

    tag: str
    seed: int
    stages: tuple[str, ...]
    samples_to_target: float | None
    steps_to_target: float | None
    time_to_target_s: float | None
    censored_at: float
    status: str


def run_schedule(
    recipe: Recipe,
    results_dir: str | Path,
    stages: Sequence[tuple[Candidate, int]],
    seed: int,
    *,
    reference_batch: int,
    tag: str,
) -> ScheduleRun:
    """Run ``stages`` = [(candidate, end in cumulative samples), ...] (the last end is ignored: it runs
    to the target or the budget) at ``seed``; candidates carry their LRs already."""
    problem = backends.checkpoint_problem(recipe)
    if problem is not None:
        raise InputError(f"{problem}, so a schedule's stages cannot resume one another")
    store = ResultsStore(results_dir)
    t = recipe.target
    ckpt_dir = store.root / "checkpoints" / f"{tag}-s{seed}"
    steps: list[StepRecord] = []
    resume: Path | None = None
    status = "budget_exhausted"
    labels = []
    for i, (cand, end) in enumerate(stages):
        last = i == len(stages) - 1
        budget = recipe.budget.max_samples if last else int(end)
        rid = f"{tag}-s{seed}-st{i}-{cand.label}"
        labels.append(cand.label)
        extra: dict = {"resume_from": resume}
        if not last:
            extra.update(save_at_samples=(int(end),), checkpoint_dir=ckpt_dir)
        if not store.is_finished(rid):
            policy = StopPolicy(t.metric, t.value, t.higher_is_better, t.ema_alpha, budget, True, math.inf)
            run_recipe = dataclasses.replace(
                recipe, budget=dataclasses.replace(recipe.budget, max_samples=budget)
            )
            execute_run(
                run_recipe, str(store.root), cand, seed, recipe.optimizer.lr, reference_batch, policy,
                rid=rid, spec_extra=extra,
            )  # fmt: skip
        found = store.run(rid)
        if found is None:
            raise InputError(f"{store.root}: the stage run {rid} did not finish; rerun to redo it")
        rec = found
        steps.extend(store.steps(rid))
        status = rec.status
        if rec.status in FAILED_STATUSES or rec.samples < budget:  # failed, or stopped at the target
            break
        resume = checkpoint_path(ckpt_dir, int(end))
    s = np.array([x.samples for x in steps], dtype=float)
    # the metric's own points (a held-out metric is logged only at evaluations), as the probe reads
    # them; the chain's steps under its last stage's record
    cs, cv = RunData(rec, tuple(steps)).curve(t.metric)
    hit = samples_to_target(cs, cv, t.value, higher_is_better=t.higher_is_better, ema_alpha=t.ema_alpha)
    other = recipe.generation.other_s_per_step
    if hit.samples_to_target is None or hit.censored:
        return ScheduleRun(
            tag, seed, tuple(labels), None, None, None, float(s[-1]) if s.size else 0.0, status
        )
    r = hit.samples_to_target
    # steps and time up to the crossing, the step that crosses counted by the fraction it needed
    prev = np.r_[0.0, s[:-1]]
    width = s - prev  # 0 for an evaluation before any update (the torch trainer's step 0)
    frac = np.clip(np.divide(r - prev, width, out=np.zeros_like(s), where=width > 0), 0.0, 1.0)
    secs = np.array([x.gen_s + x.train_s + other for x in steps])  # eval time is not training
    return ScheduleRun(
        tag,
        seed,
        tuple(labels),
        float(r),
        float(frac.sum()),
        float((frac * secs).sum()),
        float(s[-1]),
        status,
    )
