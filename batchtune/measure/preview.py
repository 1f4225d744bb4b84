"""`batchtune plan` (and `probe --dry-run`): what a probe will cost before it spends anything.

The plan (candidates, LRs, seeds) is measure/plan.py's; this module adds the budget of every run in
samples and steps, and a wall-time prediction for this machine from a few steps of each candidate
timed alone (no other run sharing the cores), in a scratch folder of the results directory. The
prediction has every run go to its budget (runs stop earlier at the target or outside the
reference's band); runs at once that compete for cores, or more load than while timing (the
other processes' cores are measured, measure/contention.py), make the probe slower than it.

    run_s(N) ~ setup_s + steps(N) * step_s(N) + evals(N) * eval_s,   steps(N) = ceil(max_samples / N)
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from batchtune import backends
from batchtune.backends.spec import Candidate, RunFailed
from batchtune.measure import contention
from batchtune.measure.async_sweep import sweep_decision
from batchtune.measure.plan import Plan, check_targets_reachable, plan_candidates, run_id, timing_spec
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore

# timed by default; "command" starts a whole trainer
IN_PROCESS_BACKENDS = ("torch", "nqm", "trl", "pretrain")
TIMING_DIR = "plan-timing"  # <results>/plan-timing/<run_id>: the cache beside it is the probe's


@dataclass(frozen=True)
class CandidateCost:
    label: str
    prompts: int
    group_size: int
    batch_responses: int
    lr: float
    seeds: int
    max_samples_per_run: int
    max_steps_per_run: int
    evals_per_run: int
    step_s: float  # median wall seconds of one training step, timed alone; nan = not timed
    eval_s: float  # seconds of one held-out evaluation (0 when the backend reports none)
    setup_s: float  # model build, warm start (cached after the first), first evaluation
    run_s_max: float  # predicted wall seconds of one run to its whole budget; nan = not timed


@dataclass(frozen=True)
class PlanPreview:
    source: str  # the recipe
    results_dir: str
    backend: str
    reference: str
    candidates: tuple[CandidateCost, ...]
    runs: int
    runs_finished: int  # already in the results directory: a probe reuses them
    workers: int
    timing_source: str  # where the wall times come from, in words
    timed_steps: int  # training steps timed per candidate; 0 = none
    total_samples_max: int
    total_steps_max: int
    wall_s_max: float  # predicted probe wall time, all runs to their budgets, `workers` at a time
    reference_run_samples: int  # one full run at the reference: the recipe's budget per run
    reference_run_s: float
    cost_vs_reference_run: float  # probe samples / one reference run's samples
    gpus: int  # hardware.num_gpus when the recipe runs on CUDA; 0 on CPU
    gpu_hours_max: float  # every run's seconds x gpus / 3600 (0 on CPU): runs at once each hold theirs
    one_off_s: float = 0.0  # paid once per results directory (the tiny model's cached warm start)
    notes: tuple[str, ...] = ()
    mode: str = "grid"  # probe.mode (measure/preview_branched.py previews "branched")
    wall_s_left_max: float = math.nan  # the same bound for the runs not yet finished (a rerun's cost)
    unit: str = "samples"  # what the samples columns count: "tokens" for the pre-training grid
    other_cores_busy: float = math.nan  # CPU cores other processes used while timing (contention.py)
    # the refinement rounds, at most (measure/pretrain_refine.py, rl_refine.py; 0 = none), in the
    refine_runs_max: int = 0
    refine_tokens_max: int = 0  # grid's unit: tokens for pre-training, samples for RL

    @property
    def branched(self) -> bool:
        """A grid preview (BranchedPlanPreview says True)."""
        return False


def evals_per_run(max_samples: int, batch: int, every: int) -> int:
    """Held-out evaluations of one run: one at the start, then every ``every`` responses."""
    steps = math.ceil(max_samples / batch)
    return 1 + (steps if every <= 0 else max_samples // every)


def time_candidate(
    recipe: Recipe, cand: Candidate, steps: int, scratch: Path, reference_batch: int | None = None
) -> tuple[float, float, float, str | None]:
    """Time ``steps`` training steps of ``cand`` alone: (step_s, eval_s, setup_s, failed).

    step_s is the median wall time between consecutive training steps, less the evaluation the
    backend reports inside a step (``other_s`` of a step that logged an eval metric); the first
    training step (allocator and kernel warm-up) is dropped when there are at least two. A run
    that fails while timed (diverged, out of memory) is data, as in a probe: ``failed`` says why,
    and the steps it took before are timed (nan if none)."""
    spec = timing_spec(recipe, cand, scratch, reference_batch or plan_candidates(recipe).reference_batch)
    backend = backends.load("training", recipe.backend.training)()
    t0 = time.perf_counter()
    stream = backend.train(spec)
    setup_s = math.nan
    eval_s = 0.0
    walls: list[float] = []
    failed = None
    try:
        last = t0
        for rec in stream:
            now = time.perf_counter()
            evaluated = any(k.startswith("eval") for k in rec.metrics)
            if rec.step == 0 or math.isnan(setup_s):
                setup_s = now - t0
                eval_s = rec.other_s if evaluated else 0.0
                if rec.step > 0:  # no separate step-0 evaluation: this was a training step too
                    walls.append(now - t0)
            else:
                walls.append(now - last - (rec.other_s if evaluated else 0.0))
            last = now
            if len(walls) >= steps:
                break
    except RunFailed as exc:
        failed = str(exc)
    finally:
        stream.close()
    use = walls[1:] if len(walls) >= 2 else walls
    return (statistics.median(use) if use else math.nan), eval_s, setup_s, failed


def grid_samples_max(recipe: Recipe) -> int:
    """A grid probe's samples at most: every candidate at every seed to its budget, in whole steps."""
    m = recipe.budget.max_samples
    per_seed = sum(
        math.ceil(m / c.batch_responses) * c.batch_responses for c in plan_candidates(recipe).candidates
    )
    return per_seed * len(recipe.budget.seeds)


UNTIMED = (math.nan, math.nan, math.nan)  # (step_s, eval_s, setup_s) of a candidate not timed


def time_candidates(
    recipe: Recipe, cands: Sequence[Candidate], time_steps: int, reference_batch: int | None = None
) -> tuple[dict[str, tuple[float, float, float]], list[str], float]:
    """``time_candidate`` for each of ``cands`` (none when ``time_steps`` is 0), in a scratch folder
    of the results directory removed after: label -> (step_s, eval_s, setup_s), a note for each
    that failed while timed, and the CPU cores other processes kept busy meanwhile
    (contention.other_cores; NaN when not timed or unknown)."""
    timed: dict[str, tuple[float, float, float]] = {}
    notes: list[str] = []
    scratch = Path(recipe.run.results_dir) / TIMING_DIR
    start = contention.read()
    try:
        for cand in cands if time_steps > 0 else []:
            step_s, eval_s, setup_s, failed = time_candidate(
                recipe, cand, time_steps, scratch, reference_batch
            )
            timed[cand.label] = (step_s, eval_s, setup_s)
            if failed:
                notes.append(
                    f"{cand.label} failed while timed ({failed}): its probe runs will likely fail the "
                    "same way, which the probe records as data and goes on"
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    other = contention.other_cores(start) if timed else math.nan
    return timed, notes, other


def timing_source(time_steps: int, backend: str, what: str, other_cores: float = math.nan) -> str:
    """Where a plan's wall times come from, in words (``what``: candidate, batch), with how busy
    the machine was with other work meanwhile (``other_cores``: measure/contention.py)."""
    if time_steps <= 0:
        if backend == "command":
            return "not timed: the command backend starts a trainer per run (pass --time-steps K)"
        return "not timed (--time-steps 0)"
    timing = f"{time_steps} training steps of each {what} timed alone on this machine"
    if backend == "nqm":
        timing += " (the simulation's own compute; its simulated step times are not wall time)"
    return timing + "; " + load_words(other_cores)


def load_words(other_cores: float) -> str:
    """How machine load was counted while timing, in words."""
    cores = contention.cpu_count()
    if not math.isfinite(other_cores):
        return "other work on the machine was not measured (no /proc/stat)"
    return (
        f"meanwhile other processes kept {other_cores:.1f} of its {cores} CPU cores busy on average "
        "(from /proc/stat, less this process): the times hold at that load and grow with more"
    )


def sharing_note(workers: int, cuda: bool) -> str:
    """What running ``workers`` runs at once does to a time predicted from runs timed alone."""
    what = "the machine" if cuda else f"this machine's {contention.cpu_count()} CPU cores"
    return (
        f"{workers} runs at a time share {what}: the predicted time assumes they do not slow each "
        "other down, so where they compete for cores the probe takes longer than predicted"
    )


def _with_setup(c: CandidateCost, setup_s: float) -> CandidateCost:
    return dataclasses.replace(c, setup_s=setup_s, run_s_max=c.run_s_max - c.setup_s + setup_s)


def _offpolicy_cost(
    costs: Sequence[CandidateCost], labels: set[str], samples: int, run_s: float, backend: str
) -> str:
    """What the off-policy / async candidates add to the probe, at most (samples, predicted seconds:
    the NQM backend's are the simulation's own compute, its simulated step times not being wall time)."""
    mine = [c for c in costs if c.label in labels]
    n = sum(c.max_samples_per_run * c.seeds for c in mine)
    secs = sum(c.run_s_max * c.seeds for c in mine)
    text = f"off-policy / async candidates: {len(mine)}, {n:,} of the {samples:,} samples at most"
    if math.isfinite(secs) and run_s > 0:  # 0.31 s, not "0 s", for a sub-second run
        a, b = (f"{x:,.0f} s" if x >= 10 else f"{x:.2g} s" for x in (secs, run_s))
        if backend == "nqm":
            text += f", {a} of the {b} the simulation computes here ({secs / run_s:.0%}; no trainer's time)"
        else:
            text += f", {a} of the {b} of run time predicted ({secs / run_s:.0%})"
    return text + "; `recommend` ranks them against the sync candidates (docs/async.md)"


_PRETRAIN_BOUNDS = (
    "upper bounds: a run stops once the lowest target loss is confirmed reached, usually "
    "before its budget (pretrain.max_tokens)"
)
_RL_BOUNDS = (
    "upper bounds: a run stops at its target (budget.stop_at_target) or once clearly slower "
    "than the reference (budget.stop_outside_band), usually well before its budget"
)


def _costs(
    cands: list[Candidate],
    seeds: int,
    max_samples: int,
    every: int,
    timed: dict[str, tuple[float, float, float]],
) -> tuple[list[CandidateCost], float]:
    """Each candidate's run at its budget, priced by its timed steps; and the one-off cost the first
    candidate timed pays (the cached warm start), counted once rather than in every run."""
    costs: list[CandidateCost] = []
    for cand in cands:
        n = cand.batch_responses
        steps = math.ceil(max_samples / n)
        evals = evals_per_run(max_samples, n, every)
        step_s, eval_s, setup_s = timed.get(cand.label, UNTIMED)
        run_s = setup_s + steps * step_s + (evals - 1) * eval_s
        costs.append(
            CandidateCost(
                cand.label,
                cand.prompts,
                cand.group_size,
                n,
                cand.lr,
                seeds,
                steps * n,
                steps,
                evals,
                step_s,
                eval_s,
                setup_s,
                run_s,
            )  # fmt: skip
        )
    setups = [c.setup_s for c in costs if math.isfinite(c.setup_s)]
    one_off_s = max(setups) - min(setups) if len(setups) >= 2 else 0.0
    if one_off_s > 0:
        costs = [_with_setup(c, min(setups)) for c in costs]
    return costs, one_off_s


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What the study kind fixes before timing: the plan, its candidates and the run's units."""

    plan: Plan
    reference_batch: int
    reference: str
    max_samples: int
    every: int
    unit: str
    bound_note: str
    sweep_notes: tuple[str, ...] = ()


def _setup(recipe: Recipe, time_steps: int | None) -> _Setup:
    """The candidates to cost: the token batches of a pre-training grid, or the RL plan less what
    the auto off-policy sweep prunes."""
    plan = plan_candidates(recipe)
    check_targets_reachable(recipe)
    if recipe.study.pretrain:  # measure.pretrain_probe: a grid of token batches, one run at a time
        ref_batch, p = plan.reference_batch, recipe.pretrain
        cands = list(plan.candidates)
        reference = next((c.label for c in cands if c.batch_responses == ref_batch), cands[0].label)
        return _Setup(
            plan, ref_batch, reference, p.max_tokens, p.eval_every_tokens, "tokens", _PRETRAIN_BOUNDS
        )
    sweep_timed = time_steps != 0 and recipe.backend.training in IN_PROCESS_BACKENDS
    sweep = sweep_decision(recipe, plan, save=False, time=sweep_timed)  # the auto off-policy sweep
    notes: tuple[str, ...] = ()
    if sweep is not None:
        kept = tuple(c for c in plan.candidates if c.label not in sweep.pruned)
        plan, notes = dataclasses.replace(plan, candidates=kept), tuple(sweep.lines())
    b, t = recipe.budget, recipe.task
    return _Setup(
        plan,
        plan.reference_batch,
        plan.reference,
        b.max_samples,
        t.eval_every_samples,
        "samples",
        _RL_BOUNDS,
        notes,
    )


def plan_preview(recipe: Recipe, time_steps: int | None = None) -> PlanPreview:
    """The probe's cost, predicted: budgets from the recipe, wall time from timed steps.

    ``time_steps``: training steps to time per candidate (None: 3 for in-process backends, none for
    the command backend, which would start a trainer per candidate; 0: do not time)."""
    store = ResultsStore.of(recipe)
    seeds = recipe.budget.seeds
    backend = recipe.backend.training
    setup = _setup(recipe, time_steps)
    plan, cands, ref_batch, reference = (
        setup.plan,
        list(setup.plan.candidates),
        setup.reference_batch,
        setup.reference,
    )
    max_samples, every, unit, bound_note = setup.max_samples, setup.every, setup.unit, setup.bound_note
    if time_steps is None:
        time_steps = 3 if backend in IN_PROCESS_BACKENDS else 0
    timed, notes, other_cores = time_candidates(recipe, cands, time_steps, ref_batch)
    notes = [*setup.sweep_notes, *notes]
    costs, one_off_s = _costs(cands, len(seeds), max_samples, every, timed)
    runs = len(costs) * len(seeds)
    # finished runs a probe reuses (not failed starts)
    reusable = {(c.label, s) for c in cands for s in seeds if store.reusable(run_id(c, s))}
    finished = len(reusable)
    workers = 1 if recipe.study.pretrain else max(1, min(recipe.run.workers, runs))
    total_run_s = one_off_s + sum(c.run_s_max * c.seeds for c in costs)
    timing = timing_source(time_steps, backend, "candidate", other_cores)
    if time_steps > 0 and workers > 1:
        notes.append(sharing_note(workers, recipe.hardware.device == "cuda"))
    ref = next(c for c in costs if c.label == reference)
    total_samples = sum(c.max_samples_per_run * c.seeds for c in costs)
    wall = total_run_s / workers
    left_s = sum(c.run_s_max for c in costs for s in seeds if (c.label, s) not in reusable)
    at_once = max(1, min(workers, runs - finished))  # what is left shares the pool as far as it fills it
    wall_left = (left_s + (one_off_s if left_s > 0 else 0.0)) / at_once
    gpus = recipe.hardware.num_gpus if recipe.hardware.device == "cuda" else 0
    if not recipe.study.pretrain and plan.offpolicy:
        notes.append(_offpolicy_cost(costs, set(plan.offpolicy), total_samples, total_run_s, backend))
    notes.append(bound_note)
    from batchtune.measure.async_topup import seeding_plan_note as seeding_note  # extra seeds, bounded
    from batchtune.measure.rl_refine import refinement_note  # the rounds' cost, bounded

    refine_note, refine_runs = refinement_note(recipe, max((c.run_s_max for c in costs), default=math.nan))
    seed_note = seeding_note(recipe, [(c.max_samples_per_run, c.run_s_max) for c in costs])
    notes += [n for n in (refine_note, seed_note) if n]
    return PlanPreview(
        source=recipe.source,
        results_dir=str(recipe.run.results_dir),
        backend=backend,
        reference=reference,
        candidates=tuple(costs),
        runs=runs,
        runs_finished=finished,
        workers=workers,
        timing_source=timing,
        timed_steps=time_steps,
        total_samples_max=total_samples,
        total_steps_max=sum(c.max_steps_per_run * c.seeds for c in costs),
        wall_s_max=wall,
        reference_run_samples=ref.max_samples_per_run,
        reference_run_s=ref.run_s_max,
        cost_vs_reference_run=total_samples / ref.max_samples_per_run,
        gpus=gpus,
        gpu_hours_max=total_run_s * gpus / 3600 if gpus else 0.0,
        one_off_s=one_off_s,
        notes=tuple(notes),
        unit=unit,
        wall_s_left_max=wall_left,
        other_cores_busy=other_cores,
        refine_runs_max=refine_runs,
        refine_tokens_max=refine_runs * max_samples,
    )
