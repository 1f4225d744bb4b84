"""`batchtune plan` for `probe.mode = "branched"`: what a branched probe can cost, before it runs.

A branched probe's cost depends on what it finds (the search picks the next batch from the last
answer, a batch is branched at more seeds while its verdict is open, a branch stops once it reaches
its level), so the plan gives upper bounds from the recipe alone (measure/branched.py for the runs):

- the trunk: the last checkpoint's samples at the reference batch;
- at each checkpoint, a control per seed at the reference, and a branch per seed at each batch the
  search can reach, every seed up to the most the sequential test allows (max of branch.max_seeds,
  branch.confirm_seeds and the planned seeds), every branch to its longest (branch.max_window_factor
  windows of W_B = max(W, min_steps x B), in whole steps), every control as long as the longest
  branch of its checkpoint (a slow control runs on that far);
- the batches the search can reach at one checkpoint: all of them for branch.search = "all"; for
  "bisect" the most its binary search can test (``bisect_worst``), taken as the dearest;
- a recipe with staleness / reuse knobs (measure/branched_async.py): per (k, u) cell the auto sweep
  keeps, a branch per seed (at most the most seeds) at the last checkpoint, at the batch the search
  adopts there, taken as the dearest, each to its longest; a step at u updates priced as u whole
  steps of its batch (generation included, so an upper bound).

Wall time comes from a few steps of each batch timed alone, as for the grid (measure/preview.py);
runs of one round share the machine ``run.workers`` at a time, the trunk runs alone.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cache

from batchtune.backends.spec import Candidate
from batchtune.measure.async_sweep import sweep_decision
from batchtune.measure.async_topup import has_async_knobs
from batchtune.measure.branch_checkpoint import CONTROL_WINDOWS
from batchtune.measure.branched import branched_recipe, branched_store, checkpoint_positions
from batchtune.measure.branched_async import offpolicy_of
from batchtune.measure.plan import Plan, check_targets_reachable, plan_candidates
from batchtune.measure.preview import (
    IN_PROCESS_BACKENDS,
    UNTIMED,
    evals_per_run,
    grid_samples_max,
    time_candidates,
    timing_source,
)
from batchtune.recipe.schema import Recipe
from batchtune.records.types import failed_before_training


@dataclass(frozen=True)
class BranchCost:
    label: str
    prompts: int
    group_size: int
    batch_responses: int
    lr: float
    window_samples: int  # W_B: the window it is compared with the control over
    window_steps: int
    longest_samples: int  # a branch's most: max_window_factor windows, in whole steps
    branches_max: int  # over all checkpoints, at the most seeds
    step_s: float  # median wall seconds of one training step, timed alone; nan = not timed
    eval_s: float
    setup_s: float
    branch_s_max: float  # one branch to its longest; nan = not timed


OFFPOLICY_POINTS = 1  # the (checkpoint, batch) points off-policy branches run at (branched_async.py)


@dataclass(frozen=True)
class OffPolicyCost:
    """One staleness / reuse cell's off-policy branches (measure/branched_async.py), at most."""

    cell: str  # k{k}u{u}: the label suffix of each main candidate's off-policy candidate
    staleness: int
    updates_per_batch: int
    batches: int  # the main batches it can run at (the one the search adopts at the last checkpoint)
    runs_max: int  # OFFPOLICY_POINTS x the most seeds a batch is branched at
    longest_samples: int  # one branch at the dearest of those batches
    branch_s_max: float  # one branch to its longest, its step priced at u updates; nan = not timed


@dataclass(frozen=True)
class BranchedPlanPreview:
    source: str
    results_dir: str
    backend: str
    reference: str
    reference_batch: int
    trunk_samples: int  # the trunk runs to the last checkpoint
    checkpoints: tuple[int, ...]  # cumulative samples
    seeds: int  # planned (budget.seeds)
    seeds_max: int  # the most seeds a batch (and its controls) can be branched at
    search: str
    batches_per_checkpoint_max: int  # of the len(candidates) larger batches
    candidates: tuple[BranchCost, ...]  # the batches above the reference
    control_samples_max: int  # one control at one checkpoint, at most
    trunk_s: float
    workers: int  # runs at once within a round
    timing_source: str
    timed_steps: int
    total_samples_max: int
    wall_s_max: float
    reference_run_samples: int  # one full run at the reference: the recipe's budget per run
    cost_vs_reference_run: float
    grid_samples_max: int  # the same recipe's grid probe, at most
    runs_finished: int  # already in <results>/branched: the probe reuses those its search asks for
    gpus: int
    gpu_hours_max: float
    notes: tuple[str, ...] = ()
    mode: str = "branched"
    unit: str = "samples"  # what the samples count: "tokens" for a pre-training recipe
    other_cores_busy: float = math.nan  # CPU cores other processes used while timing (contention.py)
    offpolicy: tuple[OffPolicyCost, ...] = ()  # a recipe with staleness / reuse knobs: counted in the totals
    offpolicy_samples_max: int = 0
    offpolicy_s_max: float = 0.0

    @property
    def branched(self) -> bool:
        """A branched preview (PlanPreview says False)."""
        return True


@cache
def bisect_worst(n: int) -> int:
    """The most batches measure/branched.py's bisect search can test at one checkpoint among n main
    candidates (the reference first), over every previous answer and every outcome."""

    def deepest(lo: int, hi: int, guess: int, prev: int) -> int:
        if hi - lo <= 1:
            return 0
        mid = guess if lo < guess < hi else (lo + hi) // 2
        return 1 + max(
            deepest(
                *((mid, hi) if ok else (lo, mid)), (mid + 1 if ok else mid - 1) if mid == prev else 0, prev
            )
            for ok in (True, False)
        )

    return max(deepest(0, n, prev if prev else n // 2, prev) for prev in range(n))


def _steps(samples: float, batch: int) -> int:
    return max(1, math.ceil(samples / batch))


@dataclass(frozen=True)
class _Priced:
    """The timed steps a preview prices its runs with, and the recipe's evaluation period."""

    timed: dict[str, tuple[float, float, float]]
    every: int

    def run_s(self, label: str, samples: int, batch: int, step_factor: float = 1.0) -> float:
        """One run of ``label`` for ``samples`` at ``batch``; each step ``step_factor`` times dearer."""
        step_s, eval_s, setup_s = self.timed.get(label, UNTIMED)
        evals = evals_per_run(samples, batch, self.every) - 1
        return setup_s + _steps(samples, batch) * step_s * step_factor + evals * eval_s


def _longest(recipe: Recipe, n: int) -> tuple[int, int]:
    """(W_B, a branch's longest) at a batch of ``n``: max_window_factor windows, in whole steps."""
    br = recipe.branch
    w = max(br.window_samples, br.min_steps * n)
    return w, _steps(br.max_window_factor * w, n) * n


def _branch_rows(recipe: Recipe, others: list[Candidate], branches: int, price: _Priced) -> list[BranchCost]:
    rows = []
    for cand in others:
        n = cand.batch_responses
        w, longest = _longest(recipe, n)
        step_s, eval_s, setup_s = price.timed.get(cand.label, UNTIMED)
        rows.append(
            BranchCost(
                cand.label, cand.prompts, cand.group_size, n, cand.lr, w, _steps(w, n), longest, branches,
                step_s, eval_s, setup_s, price.run_s(cand.label, longest, n),
            )  # fmt: skip
        )
    return rows


def _offpolicy_rows(
    recipe: Recipe, plan: Plan, main: list[Candidate], seeds_max: int, price: _Priced
) -> list[OffPolicyCost]:
    """One row per staleness / reuse cell the branched probe can run (measure/branched_async.py):
    its branches at the last checkpoint read, at whichever main batch the search adopts there (the
    dearest taken), one per seed that batch is branched at (seeds_max at most)."""
    by = plan.by_label()
    cells: dict[str, list[tuple[Candidate, Candidate]]] = {}
    for base in main:
        for lab in offpolicy_of(plan, base.label):
            cells.setdefault(lab[len(base.label) + 1 :], []).append((base, by[lab]))
    m = max(1, recipe.algorithm.mini_batches)
    rows = []
    for cell, pairs in cells.items():
        longest = max(_longest(recipe, base.batch_responses)[1] for base, _ in pairs)
        # a step at u updates: every update as dear as the base's whole step (generation included)
        secs = []
        for base, o in pairs:
            n = base.batch_responses
            secs.append(price.run_s(base.label, _longest(recipe, n)[1], n, max(1.0, o.updates_per_batch / m)))
        k, u = pairs[0][1].staleness, pairs[0][1].updates_per_batch
        rows.append(OffPolicyCost(cell, k, u, len(pairs), OFFPOLICY_POINTS * seeds_max, longest, max(secs)))
    if rows and recipe.branch.offpolicy_read == "target":
        rows = _to_target(recipe, rows, [base for base in main if offpolicy_of(plan, base.label)], price)
    return rows


def _to_target(
    recipe: Recipe, rows: list[OffPolicyCost], bases: list[Candidate], price: _Priced
) -> list[OffPolicyCost]:
    """branch.offpolicy_read = "target": every off-policy branch, and the k = 0 branch beside each
    (cell "k0"), runs from the checkpoint to the target, at most budget.max_samples past it."""
    n = recipe.budget.max_samples
    secs = max(price.run_s(b.label, n, b.batch_responses, 1.0) for b in bases)
    m = max(1, recipe.algorithm.mini_batches)
    out = [OffPolicyCost("k0", 0, 1, len(bases), rows[0].runs_max, n, secs)]
    for r in rows:
        s = max(price.run_s(b.label, n, b.batch_responses, max(1.0, r.updates_per_batch / m)) for b in bases)
        out.append(dataclasses.replace(r, longest_samples=n, branch_s_max=s))
    return out


def _offpolicy_note(swept: bool) -> str:
    text = (
        "off-policy branches: at the last checkpoint read, from the batch the search adopts there, one "
        "per (k, u) cell and seed it is branched at; bounded at the dearest batch and the most seeds, "
        "each to its longest, a step at u updates priced as u whole steps"
    )
    if swept:
        text += "; the auto sweep may prune cells before they run (measure/async_sweep.py)"
    return text + "; R(B, k, u) = R(B) x the paired ratio to the k = 0 branch (docs/branched.md)"


def _controls(recipe: Recipe, rows: list[BranchCost], dearest: list[BranchCost], b0: int) -> int:
    """One control's most samples at one checkpoint: it covers 1.25 windows of any batch tested
    (not only the dearest) and runs on as far as the longest branch where it is slow to reach the
    level."""
    w_max = max([recipe.branch.window_samples, *(r.window_samples for r in rows)])
    longest_max = max([0, *(r.longest_samples for r in dearest)])
    return _steps(max(CONTROL_WINDOWS * w_max, longest_max), b0) * b0


def _plan_of(recipe: Recipe, time_steps: int) -> tuple[Plan, tuple[str, ...]]:
    """The plan as the branched probe runs it: with the auto sweep, less the cells it prunes (a
    stored decision, or one from timing the main candidates now when the plan times steps)."""
    check_targets_reachable(recipe)
    plan = plan_candidates(recipe)
    if not plan.offpolicy or not has_async_knobs(recipe):
        return plan, ()
    timed = time_steps != 0 and recipe.backend.training in IN_PROCESS_BACKENDS
    sweep = sweep_decision(recipe, plan, save=False, time=timed)
    if sweep is None or not sweep.pruned:
        return plan, tuple(sweep.lines()) if sweep is not None else ()
    kept = tuple(lab for lab in plan.offpolicy if lab not in set(sweep.pruned))
    return dataclasses.replace(plan, offpolicy=kept), tuple(sweep.lines())


def branched_plan_preview(recipe: Recipe, time_steps: int | None = None) -> BranchedPlanPreview:
    recipe = branched_recipe(recipe)  # a pre-training recipe: token batches, its eval loss and budget
    backend = recipe.backend.training
    if time_steps is None:
        time_steps = 3 if backend in IN_PROCESS_BACKENDS else 0
    plan, sweep_notes = _plan_of(recipe, time_steps)
    by_label = plan.by_label()
    main = [by_label[lab] for lab in plan.main]
    ref = by_label[plan.reference]
    b0 = ref.batch_responses
    br = recipe.branch
    every = recipe.pretrain.eval_every_tokens if recipe.study.pretrain else recipe.task.eval_every_samples
    ckpts = checkpoint_positions(recipe, b0)
    seeds_max = max(br.max_seeds, br.confirm_seeds, len(recipe.budget.seeds))
    others = main[1:]
    k = len(others) if br.search == "all" else min(len(others), bisect_worst(len(main)))
    timed, notes, other_cores = time_candidates(recipe, main, time_steps)
    notes = [*sweep_notes, *notes]
    price = _Priced(timed, every)
    rows = _branch_rows(recipe, others, len(ckpts) * seeds_max, price)
    dearest = sorted(rows, key=lambda r: r.longest_samples, reverse=True)[:k]
    control = _controls(recipe, rows, dearest, b0)
    off = _offpolicy_rows(recipe, plan, main, seeds_max, price)
    off_samples = sum(r.runs_max * r.longest_samples for r in off)
    off_s = sum(r.runs_max * r.branch_s_max for r in off)
    per_ckpt = seeds_max * (control + sum(r.longest_samples for r in dearest))
    total = ckpts[-1] + len(ckpts) * per_ckpt + off_samples
    trunk_s = price.run_s(ref.label, ckpts[-1], b0)
    # a control is a chain of segments (a longer window, a slow control run on), each with its start
    setup0 = timed.get(ref.label, UNTIMED)[2]
    control_s = price.run_s(ref.label, control, b0) + 2 * k * setup0
    total_s = trunk_s + len(ckpts) * seeds_max * (control_s + sum(r.branch_s_max for r in dearest)) + off_s
    workers = max(1, min(recipe.run.workers, seeds_max))  # a round: a run per seed (docs/branched.md)
    if time_steps > 0 and workers > 1:
        # rounds are of varying size (a confirmation seed's is two runs, a slow control's extension
        # often one), so only one run at a time is a bound on the wall time; runs at once shorten it
        notes.append(
            f"the wall time is for one run at a time: with run.workers = {recipe.run.workers}, up to "
            f"{workers} runs of a round go at once and shorten it where they do not share cores"
        )
    if off:
        notes.append(_offpolicy_note(recipe.probe.async_sweep == "auto"))
    notes.append(_BOUNDS)
    one_run = _steps(recipe.budget.max_samples, b0) * b0
    gpus = recipe.hardware.num_gpus if recipe.hardware.device == "cuda" else 0
    return BranchedPlanPreview(
        source=recipe.source,
        results_dir=str(recipe.run.results_dir),
        backend=backend,
        reference=plan.reference,
        reference_batch=b0,
        trunk_samples=ckpts[-1],
        checkpoints=ckpts,
        seeds=len(recipe.budget.seeds),
        seeds_max=seeds_max,
        search=br.search,
        batches_per_checkpoint_max=k,
        candidates=tuple(rows),
        control_samples_max=control,
        trunk_s=trunk_s,
        workers=workers,
        timing_source=timing_source(time_steps, backend, "batch", other_cores),
        timed_steps=time_steps,
        total_samples_max=total,
        wall_s_max=total_s,
        reference_run_samples=one_run,
        cost_vs_reference_run=total / one_run,
        grid_samples_max=grid_samples_max(recipe),
        runs_finished=sum(
            not failed_before_training(r) for r in branched_store(recipe.run.results_dir).runs()
        ),
        gpus=gpus,
        gpu_hours_max=total_s * gpus / 3600 if gpus else 0.0,  # every run holds its GPUs
        notes=tuple(notes),
        unit=recipe.sample_unit,
        other_cores_busy=other_cores,
        offpolicy=tuple(off),
        offpolicy_samples_max=off_samples,
        offpolicy_s_max=off_s,
    )


_BOUNDS = (
    "upper bounds: every batch the search can reach at its most seeds, every branch and control to "
    "its longest; a branch stops once it reaches its level, most batches are adopted or rejected on "
    "the planned seeds, and the search usually tests fewer batches (docs/branched.md, measured costs)"
)
