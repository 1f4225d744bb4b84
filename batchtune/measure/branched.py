"""Branched probes (`probe.mode = "branched"`): one trunk, short branches from its checkpoints.

Merrill et al. 2025 ("Critical Batch Size Revisited", arXiv 2505.23971): a run at the reference
batch B0 (the trunk, first seed of budget.seeds) saves checkpoints at `branch.checkpoints` x
`branch.trunk_samples`; from each checkpoint every main candidate B runs a branch at its scaled LR,
once per seed. The reference's own branch (the control) runs 1.25 windows; the local target is the
median of the controls' fitted metric one window past the checkpoint (a control that has not reached
it runs on, up to a branch's longest). A batch B whose window would be fewer
than `branch.min_steps` of its own steps gets the window W_B = min_steps * B instead, and every
control is extended to cover it by a segment resumed from its own end (a chain; nothing is rerun).
The other branches stop once they reach the level (confirmed 25% past it) or after
`branch.max_window_factor` windows (censored); `branch.search = "bisect"` branches only the batches a
binary search for the last one within 1+tol needs (from the previous checkpoint's answer, one step
up if it holds there, one down if not), and a batch it would climb past is branched at more seeds
(each with its own control) until the sequential test of analysis/branched/ratios.adoption decides:
at least `branch.confirm_seeds` seeds whose upper confidence bound is within 1+tol, at most
`branch.max_seeds`.
measure/branch_checkpoint.py runs one checkpoint's controls and branches; analysis/branched/ratios.py turns
the curves into the local critical batch per checkpoint. A checkpoint whose controls make no
progress in the window (a plateau, or a metric too noisy for the window) is not read: it is noted,
its controls' samples are counted, and the other checkpoints answer (NoProgress only if none can).

Every trunk and branch is an ordinary run of the results store under `<results>/branched/`: sealed
by its run.json, never redone; a run killed at any point (even kill -9) is redone from its start on
rerun, and a trunk redone rewrites the same checkpoints (the backends are deterministic per seed).
They run where the recipe says (`run.workers`, `run.executor`: measure/execute.Runner), a round at a
time: the search is sequential, but a round's runs (every seed's control segment, or a batch's
branches, one per seed, beside the controls of seeds the round starts) do not depend on each other.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from batchtune import backends
from batchtune.analysis.branched.offpolicy import OffPolicyInput
from batchtune.analysis.branched.ratios import LocalCritical
from batchtune.analysis.branched.summary import BranchedSummary, summarise_branched
from batchtune.analysis.sample.efficiency import RunData, SampleEfficiency
from batchtune.backends import lifeguard
from batchtune.backends.spec import Candidate
from batchtune.errors import AnalysisError, InputError, NoProgress
from batchtune.events import ProbeEvents
from batchtune.measure import failed_starts
from batchtune.measure.async_sweep import SWEEP_HELD
from batchtune.measure.branch_checkpoint import (
    AtCheckpoint,
    Job,
    checkpoint_of,
    control_curve,
    efficiency_of,
    origin,
    search_batches,
)
from batchtune.measure.branched_async import (
    OffPolicyBranches,
    candidate_index,
    judged,
    offpolicy_plan,
    run_offpolicy,
)
from batchtune.measure.execute import Runner, run_until_finished
from batchtune.measure.one_run import execute_run
from batchtune.measure.plan import Plan, check_targets_reachable, plan_candidates
from batchtune.measure.probe import check_manifest, keep_recipe, say_held
from batchtune.measure.stop_rule import StopPolicy
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore
from batchtune.records.types import FAILED_STATUSES


@dataclass(frozen=True)
class BranchedRuns:
    """What the branched probe measured, as plain data for analysis/branched/summary.py."""

    plan: Plan
    trunk: RunData
    checkpoints: tuple[int, ...]  # cumulative samples of each checkpoint
    locals: tuple[LocalCritical, ...]
    branches: tuple[RunData, ...]
    skipped: dict[int, tuple[str, ...]]  # checkpoint -> labels the search did not branch
    unread: dict[int, str]  # checkpoint -> why no local ratio could be read there (its controls
    # made no progress in the window); its controls' samples are spent all the same
    runs_done: int
    runs_skipped: int
    wall_s: float
    other_runs: int = 0  # runs in the store from other branch settings: neither read nor counted
    offpolicy: OffPolicyBranches | None = None  # staleness / updates per batch, measure/branched_async.py

    def of(self, label: str) -> list[RunData]:
        return [r for r in self.branches if r.record.candidate == label]


def branched_store(results_dir: str | Path) -> ResultsStore:
    return ResultsStore(Path(results_dir) / "branched")


def checkpoint_positions(recipe: Recipe, reference_batch: int) -> tuple[int, ...]:
    """Checkpoints in cumulative samples: fractions of the trunk rounded to whole trunk steps (a
    fraction 0 is the initialisation itself: its branches are fresh runs)."""
    b = recipe.branch
    out = {
        (max(1, round(f * b.trunk_samples / reference_batch)) if f > 0 else 0) * reference_batch
        for f in b.checkpoints
    }
    return tuple(sorted(out))


def _trunk_id(ref: Candidate, seed: int) -> str:
    return f"trunk-{ref.label}-s{seed}"


def branched_recipe(recipe: Recipe) -> Recipe:
    """The recipe as the branched probe reads it. A pre-training recipe (backend.training =
    "pretrain") is compared on its eval loss (lower is better; logged every
    ``pretrain.eval_every_tokens``) against its lowest target loss, its runs' budget is
    ``pretrain.max_tokens``, and its candidates are its token batches (measure/plan.py), so samples
    are tokens throughout. Any other recipe is returned as it is."""
    if not recipe.study.pretrain:
        return recipe
    p = recipe.pretrain
    target = dataclasses.replace(
        recipe.target, metric="eval_loss", value=min(p.targets), higher_is_better=False
    )
    budget = dataclasses.replace(recipe.budget, max_samples=p.max_tokens)
    return dataclasses.replace(recipe, target=target, budget=budget)


def _with_budget(recipe: Recipe, max_samples: int) -> Recipe:
    return dataclasses.replace(recipe, budget=dataclasses.replace(recipe.budget, max_samples=max_samples))


class _JobRunner:
    """Runs a branched probe's jobs, counting those run and reused, keeping the ones asked for in
    order; ``read_only``: a missing run is an InputError, nothing is trained."""

    def __init__(
        self,
        recipe: Recipe,
        store: ResultsStore,
        reference_batch: int,
        runner: Runner,
        progress: ProbeEvents | None,
        read_only: bool,
    ) -> None:
        self.recipe, self.store, self.reference_batch = recipe, store, reference_batch
        self.runner, self.progress, self.read_only = runner, progress, read_only
        self.done = self.skipped = 0
        self.asked: dict[str, None] = {}

    def __call__(self, jobs: list[Job]) -> None:
        todo = []
        for job in jobs:
            self.asked[job.rid] = None
            if self.store.is_finished(job.rid):
                self.skipped += 1
            elif self.read_only:
                raise InputError(
                    f"{self.store.root} lacks the run {job.rid}: run `batchtune probe` to finish it"
                )
            else:
                todo.append(job)
        recipe = self.recipe
        args = [
            (_with_budget(recipe, j.budget), str(self.store.root), j.cand, j.seed, recipe.optimizer.lr)
            + (self.reference_batch, j.policy, j.rid, j.extra)
            for j in todo
        ]
        # a run another live process holds (a second probe of this results_dir, or a worker of a
        # killed one still dying) is waited for, as a grid probe's is
        self.done += run_until_finished(
            self.store, args, [j.rid for j in todo], partial(self.runner.run, execute_run), self.progress
        )


def _trunk(store: ResultsStore, trunk_id: str, last_checkpoint: int) -> RunData:
    """The finished trunk; a trunk that could not start, failed or stopped short is refused."""
    trunk_rec = store.run(trunk_id)
    if trunk_rec is not None:  # as the grid's reference: a trunk that could not start
        failed_starts.stop_if_none_started([trunk_rec], f"the trunk {trunk_id}", "no branch was run")
    if trunk_rec is None or trunk_rec.status in FAILED_STATUSES or trunk_rec.samples < last_checkpoint:
        why = trunk_rec.reason if trunk_rec else "it did not finish"
        raise AnalysisError(f"the trunk {trunk_id} did not reach its last checkpoint: {why}")
    return RunData(trunk_rec, tuple(store.steps(trunk_id)))


def run_branched(
    recipe: Recipe, progress: ProbeEvents | None = None, *, read_only: bool = False
) -> BranchedRuns:
    """Run (or resume) the trunk and the branches of ``recipe``; returns the measured curves.

    ``read_only``: train nothing, read what is there (InputError if a needed run is missing)."""
    t0 = time.perf_counter()
    problem = backends.checkpoint_problem(recipe)
    if problem is not None:
        raise InputError(f"{problem}, so probe.mode = 'branched' cannot use it; use probe.mode = 'grid'")
    check_targets_reachable(recipe)  # before the manifest: a refused recipe leaves nothing behind
    root = ResultsStore.of(recipe)
    check_manifest(root, recipe, read_only=read_only)
    recipe = branched_recipe(recipe)
    store = branched_store(recipe.run.results_dir)
    if not read_only:
        failed_starts.reopen(store, progress)  # a trainer that could not start: not data
    plan = offpolicy_plan(recipe, plan_candidates(recipe), lambda: say_held(SWEEP_HELD, root, progress))
    if not read_only:  # the candidates a resume edited: `recommend --results DIR` reads them
        keep_recipe(root, recipe)
    by_label = plan.by_label()
    main = [by_label[lab] for lab in plan.main]
    ref = by_label[plan.reference]
    b0 = ref.batch_responses
    seeds = list(recipe.budget.seeds)
    t = recipe.target
    ckpts = checkpoint_positions(recipe, b0)
    ckpt_dir = store.root / "checkpoints"

    def policy(target: float, max_samples: int, origin: int, stop: bool) -> StopPolicy:
        return StopPolicy(
            t.metric, target, t.higher_is_better, t.ema_alpha, max_samples, stop, math.inf, origin
        )

    trunk_id = _trunk_id(ref, seeds[0])
    if progress is not None:
        # how many runs the search makes is not known ahead (`batchtune plan` bounds it)
        progress("plan", {"total": None, "todo": None, "max_samples": ckpts[-1]})
    save = {"save_at_samples": ckpts, "checkpoint_dir": ckpt_dir}  # a backend saves only past its start
    # SIGTERM unwinds as Ctrl-C does (a grid's probe too): pool workers and trainers are stopped,
    # runs under way are left unsealed, exit 143
    with lifeguard.sigterm_raises(), Runner(recipe, progress) as runner:
        run = _JobRunner(recipe, store, plan.reference_batch, runner, progress, read_only)
        run([Job(ref, seeds[0], trunk_id, ckpts[-1], policy(t.value, ckpts[-1], 0, False), save)])
        trunk = _trunk(store, trunk_id, ckpts[-1])
        ts, tv = trunk.curve(t.metric)

        locals_: list[LocalCritical] = []
        skipped: dict[int, tuple[str, ...]] = {}
        unread: dict[int, str] = {}
        prev_lo = 0  # index in main of the last batch within tolerance at the previous checkpoint
        last: tuple[AtCheckpoint, dict[int, bool]] | None = None  # the last checkpoint read, verdicts
        for c in ckpts:
            try:
                at = AtCheckpoint(recipe, store, run, policy, ref, c, float(np.interp(c, ts, tv)), ckpt_dir)
            except NoProgress as exc:  # a plateau or noise at this checkpoint: read the others
                unread[c] = str(exc)
                continue
            last = (at, {})
            tested, prev_lo = search_batches(
                len(main), partial(judged, at, main, last[1]), recipe.branch.search, prev_lo
            )
            skipped[c] = tuple(main[i].label for i in range(1, len(main)) if i not in tested)
            locals_.append(at.local_critical())
        off = None if last is None else run_offpolicy(last[0], plan, main, candidate_index(last[1]))
    if not locals_:
        raise NoProgress("; ".join(unread.values()))
    # only the runs these settings asked for: a results_dir may also hold the runs of other branch
    # settings (another trunk length, checkpoints or seeds), which this probe neither read nor paid for
    mine = [store.run(rid) for rid in run.asked if rid != trunk_id]
    branches = tuple(RunData(r, tuple(store.steps(r.run_id))) for r in mine if r is not None)
    others = len(store.runs()) - len(branches) - 1
    return BranchedRuns(
        plan, trunk, tuple(c for c in ckpts if c not in unread), tuple(locals_), branches, skipped, unread,
        run.done, run.skipped, time.perf_counter() - t0, other_runs=others, offpolicy=off,
    )  # fmt: skip


@dataclass(frozen=True)
class BranchedProbeResult:
    """What `probe` returns in branched mode: ProbeResult's fields plus the branched summary."""

    plan: Plan
    efficiency: SampleEfficiency
    summary: BranchedSummary
    runs: BranchedRuns
    runs_done: int
    runs_skipped: int
    wall_s: float
    plot_path: Path | None = None


def analyse_branched(recipe: Recipe, runs: BranchedRuns) -> BranchedSummary:
    """Candidates with their measured timings and costs (the trunk counted to the reference), then
    analysis/branched/summary.py."""
    recipe = branched_recipe(recipe)
    t = recipe.target
    by_label = runs.plan.by_label()
    trunk = {runs.plan.reference: [runs.trunk]}
    cands = [efficiency_of(by_label[lab], [*runs.of(lab), *trunk.get(lab, [])]) for lab in runs.plan.main]
    o = runs.offpolicy
    off = (
        []
        if o is None
        else [OffPolicyInput(efficiency_of(by_label[k], runs.of(k)), o.base, v) for k, v in o.ratios.items()]
    )
    ts, tv = runs.trunk.curve(t.metric)
    # a checkpoint whose controls made no progress: not read, but its controls were paid for
    unread_samples = sum(
        r.record.samples - origin(r.record.run_id)
        for r in runs.branches
        if checkpoint_of(r.record.run_id) in runs.unread
    )
    return summarise_branched(
        ts,
        tv,
        runs.locals,
        cands,
        reference=runs.plan.reference,
        metric=t.metric,
        target=t.value,
        higher_is_better=t.higher_is_better,
        tolerance=t.tolerance,
        confidence=t.confidence,
        reference_curve=reference_curve(branched_store(recipe.run.results_dir), runs, t.metric),
        notes=[
            *(
                f"checkpoint at {c:,} {recipe.sample_unit} not read, the others were: {why}"
                for c, why in runs.unread.items()
            ),
            *([other_runs_note(runs.other_runs)] if runs.other_runs else []),
        ],
        unread_samples=unread_samples + (o.samples if o is not None else 0),
        unit=recipe.sample_unit,
        offpolicy=off,
    )


def other_runs_note(n: int) -> str:
    return (
        f"{n} run(s) in this results_dir belong to other branch settings (another trunk, checkpoints or "
        "seeds): not read and not counted in this probe's cost"
    )


def reference_curve(store: ResultsStore, runs: BranchedRuns, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """The longest curve of the reference batch: the trunk, continued by its own seed's control at
    the last checkpoint (the trunk's exact continuation, resumed from its state at the same seed,
    run on past its window where a larger batch's window needed it). R(B0) is read or extrapolated
    from it: a longer curve at no extra cost (docs/branched.md)."""
    ts, tv = runs.trunk.curve(metric)
    last = runs.checkpoints[-1]
    ref = runs.plan.by_label()[runs.plan.reference]
    own = control_curve(store, last, ref, runs.trunk.record.seed, metric, upto=math.inf)
    after = own.samples > 0
    return np.r_[ts[ts <= last], own.samples[after] + last], np.r_[tv[ts <= last], own.values[after]]


def unmeasured(result: BranchedProbeResult) -> list[tuple[str, float]]:
    """(label, batch) of the main candidates no checkpoint branched (the search bracketed the
    critical batch without them)."""
    have = {c.label for c in result.efficiency.candidates}
    by_label = result.plan.by_label()
    return [(lab, float(by_label[lab].batch_responses)) for lab in result.plan.main if lab not in have]


def thin_evidence(result: BranchedProbeResult) -> list[str]:
    """The branched probe's own reasons its answer rests on less than planned: checkpoints it
    could not read (their controls made no progress)."""
    unread = result.runs.unread
    if not unread:
        return []
    n = len(unread) + len(result.runs.checkpoints)
    read = ", ".join(f"{c:,}" for c in result.runs.checkpoints)
    return [
        f"the answer rests on {len(result.runs.checkpoints)} of {n} checkpoints (read: {read} "
        f"{result.efficiency.unit}); "
        "the others' controls made no progress in the window"
    ]


def run_branched_probe(
    recipe: Recipe, progress: ProbeEvents | None = None, *, read_only: bool = False
) -> BranchedProbeResult:
    """Run (or resume) a branched probe and read it (`batchtune probe` with probe.mode = branched)."""
    runs = run_branched(recipe, progress, read_only=read_only)
    summary = analyse_branched(recipe, runs)
    return BranchedProbeResult(
        plan=runs.plan,
        efficiency=summary.efficiency,
        summary=summary,
        runs=runs,
        runs_done=runs.runs_done,
        runs_skipped=runs.runs_skipped,
        wall_s=runs.wall_s,
    )
