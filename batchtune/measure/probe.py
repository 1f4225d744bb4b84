"""`batchtune probe`: short LR-scaled training runs at several batches, resumable (method.md §3, §7).

Order of work: the reference candidate first (all seeds), so every other run can stop as soon as it is
clearly outside the reference's tolerance band; then the rest, in local processes or on Ray. Each run
streams StepRecords into the results store; a run is finished when its run.json exists, so a probe
killed at any moment (even kill -9) and rerun redoes only unfinished runs, with the same answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchtune.analysis.sample.assess import analyse_runs
from batchtune.analysis.sample.efficiency import RunData, SampleEfficiency
from batchtune.backends import lifeguard
from batchtune.backends.spec import Candidate
from batchtune.errors import AnalysisError, BackendError, InputError, MetricMissingError, RecipeError
from batchtune.events import ProbeEvents
from batchtune.measure import failed_starts, preflight
from batchtune.measure.async_sweep import SWEEP_HELD, pruned_plan
from batchtune.measure.async_topup import add_async_seeds
from batchtune.measure.execute import run_jobs
from batchtune.measure.guards import check_target_range
from batchtune.measure.one_run import execute_run
from batchtune.measure.plan import Plan, plan_candidates, run_id
from batchtune.measure.rl_refine import RLRefineRound, read_rounds, refine_rounds, rounds_note, stored_plan
from batchtune.measure.sequential import add_seeds, with_extra_seeds
from batchtune.measure.stop_rule import NO_BAND, band_of, stop_policy
from batchtune.recipe.checks import another_recipe
from batchtune.recipe.load import recipe_from_dict
from batchtune.recipe.schema import CandidatesConfig, PretrainConfig, Recipe
from batchtune.records.files import locked_waiting
from batchtune.records.store import ResultsStore

# Recipe sections whose change makes earlier runs incomparable with new ones.
from batchtune.records.types import failed_before_training

# Recipe sections whose change makes earlier runs incomparable with new ones.
_RUN_DEFINING = ("model", "task", "algorithm", "optimizer", "lr_scaling", "nqm", "target")
_RUN_DEFINING_KEYS = {
    "backend": ("training", "command"),
    "generation": ("max_new_tokens", "temperature", "top_p"),
    "budget": ("max_samples",),
    # a pre-training run is shaped by its model, data, schedule, budget, targets and evaluation:
    # every key but the grid of batches (adding one is adding a candidate)
    "pretrain": tuple(f.name for f in dataclasses.fields(PretrainConfig) if f.name != "batches_tokens"),
}

# The keys that name a probe's candidates (measure/plan.py: plan_candidates, plan_pretrain) and that
# a resumed probe may edit: what a resume stores of its recipe (keep_recipe).
CANDIDATE_KEYS = {
    "candidates": tuple(f.name for f in dataclasses.fields(CandidatesConfig)),
    "probe": ("staleness", "updates_per_batch", "async_sweep"),
    "pretrain": ("batches_tokens",),
}

ProgressFn = ProbeEvents
# The rounds after the planned runs (refinement, extra seeds, the async top-up) are each decided from
# the runs finished so far and recorded in one file: one probe at a time on a results directory
# decides them. A second one waits, then finds them done and goes on as a resumed probe (two at once
# overwrote each other's top-up record, and decided rounds from the other's half-finished ones).
# The lock file is in runs/, which every probe of the directory writes (its runs), also where the
# root is not writable: there it could not be made, and probes went on unlocked (records.files.locked;
# a finished probe on a read-only directory still needs none, and holds at once). The root's lock
# file is taken too, first (where it can be made): versions up to 89d660e lock it alone, and a probe
# of one of them on the same directory is then excluded as well.
ROUNDS_LOCK = ".rounds.lock"
ROUNDS_HELD = (
    "another batchtune process is adding seeds or rounds in {}; waiting for it to finish them "
    "(their runs are then reused here)"
)


@dataclass(frozen=True)
class ProbeResult:
    plan: Plan
    efficiency: SampleEfficiency
    runs_done: int  # runs executed by this invocation
    runs_skipped: int  # finished earlier and reused
    wall_s: float
    plot_path: Path | None = None  # the learning-curve plot, drawn by the workflow
    notes: tuple[str, ...] = ()  # e.g. a plot that could not be written (a read-only directory)
    refinement: tuple[RLRefineRound, ...] = ()  # rounds that added P between grid points (rl_refine.py)


def _defining(recipe: Recipe) -> dict[str, Any]:
    data = recipe.to_dict()
    out: dict[str, Any] = {k: data[k] for k in _RUN_DEFINING}
    for section, keys in _RUN_DEFINING_KEYS.items():
        out[section] = {k: data[section][k] for k in keys}
    return out


def check_manifest(store: ResultsStore, recipe: Recipe, *, read_only: bool = False) -> None:
    """Write the manifest, or refuse to mix runs of a different recipe into an existing directory
    (``read_only``: a reader such as `recommend`, told to give the probe's recipe, not to delete)."""
    manifest = store.read_manifest()
    if manifest is None:
        plan_candidates(recipe)  # a recipe it cannot plan (a bad lr_scaling.table key) writes nothing
        store.write_manifest({"recipe": recipe.to_dict(), "source": recipe.source, "created": time.time()})
        return
    where = store.manifest_path
    if not isinstance(manifest.get("recipe"), dict):
        raise InputError(f"{where} has no recipe table; move it away (or use another --results directory)")
    try:
        old = recipe_from_dict(manifest["recipe"], str(where))
    except RecipeError as exc:  # never compare against a recipe that cannot be read: say so
        raise InputError(f"{where}: the stored recipe is unreadable ({exc}); use another --results") from None
    if _defining(old) != _defining(recipe) and _only_failed_runs(store):
        # every run failed (a recipe error, now fixed): keep them aside and start over
        store.runs_dir.rename(store.root / f"runs.failed-{time.time_ns()}")
        store.write_manifest({"recipe": recipe.to_dict(), "source": recipe.source, "created": time.time()})
        return
    if _defining(old) != _defining(recipe):
        diffs = [
            f"{sec}.{key}"
            for sec, values in _defining(recipe).items()
            for key, value in values.items()
            if _defining(old)[sec].get(key) != value
        ]
        if read_only:  # a reader needs every key the probe ran with, its grid and branches too
            diffs = _changed(old.to_dict(), recipe.to_dict())
        head = f"{store.root} holds a probe of a different recipe (changed: {', '.join(diffs[:8])})"
        if read_only:
            raise InputError(
                f"{head}; give the recipe and --set values the probe ran with, or leave the recipe out "
                f"to read the one stored there (--results {store.root})"
            )
        raise InputError(f"{head}; use another --results directory, or delete it to start over")


def _changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The ``section.key`` names whose values differ between two recipes' tables (not ``run``)."""
    return [
        f"{sec}.{key}"
        for sec, values in new.items()
        if sec != "run" and isinstance(values, dict)
        for key, value in values.items()
        if (old.get(sec) or {}).get(key) != value
    ]


def keep_recipe(store: ResultsStore, recipe: Recipe) -> None:
    """The manifest with the candidates of the recipe a resumed probe runs (checked:
    ``check_manifest``, and its runs' LRs), where they differ, so `recommend --results DIR` (which
    reads it) ranks that recipe's candidates, as the probe does (not the runs of one it dropped).
    Only ``CANDIDATE_KEYS`` are stored: every other key keeps its first value (a rerun at fewer
    seeds that ran nothing made the runs of the others extra seeds). A directory this user cannot
    write keeps the recipe it has: nothing about the runs changed."""
    manifest = store.read_manifest()
    if manifest is None:
        return
    stored, new = manifest["recipe"], recipe.to_dict()
    kept = dict(stored)
    for sec, keys in CANDIDATE_KEYS.items():
        kept[sec] = {**(stored.get(sec) or {}), **{k: new[sec][k] for k in keys}}
    if kept != stored:
        with contextlib.suppress(OSError):
            store.write_manifest({**manifest, "recipe": kept})


def _only_failed_runs(store: ResultsStore) -> bool:
    """Whether the store holds runs and every one of them failed (status ``failed``)."""
    runs = store.runs()
    return bool(runs) and all(r.status == "failed" for r in runs)


def load_run_data(store: ResultsStore) -> list[RunData]:
    """The finished runs the analysis reads: not those that failed before training (not data)."""
    return [
        RunData(rec, tuple(store.steps(rec.run_id)))
        for rec in store.runs()
        if not failed_before_training(rec)
    ]


def analyse_store(
    store: ResultsStore,
    recipe: Recipe,
    plan: Plan | None = None,
    *,
    planned_only: bool = False,
    drop_seeds: frozenset[int] = frozenset(),
    recipe_plan: Plan | None = None,
) -> SampleEfficiency:
    """The sample efficiency of the store's runs (``planned_only``: only ``plan``'s candidates at
    the planned seeds, budget.seeds: what a refinement round decides from, measure/rl_refine.py;
    ``drop_seeds``: less the runs of these seeds, the async top-up's paired-seed evidence).

    The probe's runs of a candidate ``recipe_plan`` (default ``plan``) does not have are left out,
    with a note: a recipe edited to drop a candidate keeps its runs in the directory, and the probe's
    top-up, `recommend`, `report` and `check` rank the recipe's candidates only. Imported runs
    (``source`` not "probe") are ranked wherever they fall."""
    if store.runs_dir.exists() and not store.runs_dir.is_dir():
        raise InputError(f"{store.runs_dir} is a file, not the runs folder: move it away")
    runs = [r for r in load_run_data(store) if r.record.seed not in drop_seeds]
    runs, left_out = _planned_probe_runs(runs, plan if recipe_plan is None else recipe_plan)
    if planned_only and plan is not None:
        labels, seeds = set(plan.by_label()), set(recipe.budget.seeds)
        runs = [r for r in runs if r.record.candidate in labels and r.record.seed in seeds]
    if not runs:
        branched = store.root / "branched"  # measure.branched's store: its runs are read in that mode
        if not recipe.study.branched and branched.is_dir() and any(branched.iterdir()):
            raise InputError(
                f"{store.root} holds a branched probe's runs and no grid runs: add "
                "--set probe.mode=branched (or set it in the recipe)"
            )
        if left_out:
            raise InputError(f"{store.root} has no runs of the recipe's candidates ({left_out})")
        raise InputError(f"{store.root} has no finished runs; run `batchtune probe` first")
    families = None
    if plan is not None:
        families = {lab: "group_sweep" for lab in plan.group_sweep}
        families.update({lab: "fixed_lr" for lab in plan.fixed_lr})
        families.update({lab: "offpolicy" for lab in plan.offpolicy})
        families.update({lab: "main" for lab in plan.main})  # a label in two sweeps is main
    try:
        eff = _analyse(runs, recipe, plan, families)
    except MetricMissingError:
        other = another_recipe(store.read_manifest(), recipe, store.root)
        if other is None:
            raise
        raise InputError(other) from None
    notes = [n for n in (rounds_note(read_rounds(store)), left_out) if n]
    eff = eff if not notes or planned_only else dataclasses.replace(eff, notes=(*eff.notes, *notes))
    return with_extra_seeds(eff, runs, recipe.budget.seeds)


def _planned_probe_runs(runs: list[RunData], plan: Plan | None) -> tuple[list[RunData], str]:
    """``runs`` less the probe's runs of candidates ``plan`` does not have, and one line naming
    those candidates ("" when none; no plan: every run)."""
    if plan is None:
        return runs, ""
    labels = set(plan.by_label())
    out = [r for r in runs if not r.record.imported and r.record.candidate not in labels]
    if not out:
        return runs, ""
    gone = sorted({r.record.candidate for r in out})
    kept = [r for r in runs if r.record.imported or r.record.candidate in labels]
    return kept, (
        f"left out {', '.join(gone)} ({len(out)} probe runs kept in the results directory): not in the "
        "recipe's candidates; re-add them to rank them"
    )


def _analyse(
    runs: list[RunData], recipe: Recipe, plan: Plan | None, families: dict[str, str] | None
) -> SampleEfficiency:
    t = recipe.target
    return analyse_runs(
        runs,
        metric=t.metric,
        target=t.value,
        higher_is_better=t.higher_is_better,
        tolerance=t.tolerance,
        ema_alpha=t.ema_alpha,
        confidence=t.confidence,
        reference=plan.reference if plan else None,
        families=families,
    )


def _check_finished_runs_match(store: ResultsStore, plan: Plan) -> None:
    """A finished run is reused only if it was made at the LR the plan now gives its candidate.

    Adding a smaller batch moves the reference batch, and with it every scaled LR: earlier runs then
    belong to another experiment."""
    planned = plan.by_label()
    for rec in store.runs():
        cand = planned.get(rec.candidate)
        if cand is None:
            continue
        if not math.isclose(rec.lr, cand.lr, rel_tol=1e-9) or rec.reference_batch != plan.reference_batch:
            raise InputError(
                f"{store.root}: run {rec.run_id} used lr {rec.lr:.4g} (reference batch "
                f"{rec.reference_batch}) but this plan gives {cand.lr:.4g} (reference batch "
                f"{plan.reference_batch}); keep the smallest batch, set lr_scaling.reference_batch, "
                "or use another --results directory"
            )


def reference_band(store: ResultsStore, recipe: Recipe, plan: Plan) -> tuple[float, float]:
    """(samples, seconds) past which a candidate that has not reached the target is clearly out
    (measure/stop_rule.py), from one analysis of the store; NO_BAND from a partial reference (a seed
    unfinished, held elsewhere or failed to start) or one without a finite estimate."""
    ref = plan.by_label().get(plan.reference)
    if ref is None or not all(store.is_finished(run_id(ref, s)) for s in recipe.budget.seeds):
        return NO_BAND
    try:
        eff = analyse_store(store, recipe, plan)
    except AnalysisError:
        return NO_BAND
    return band_of(eff, plan.reference, recipe)


def run_probe(recipe: Recipe, progress: ProgressFn | None = None) -> ProbeResult:
    """Run (or resume) the probe of ``recipe`` into its results directory and analyse it."""
    t0 = time.perf_counter()
    store = ResultsStore.of(recipe)
    check_target_range(recipe)
    preflight.check(recipe)  # task, prompts file, reward import, command placeholders: before any write
    check_manifest(store, recipe)
    # the auto off-policy sweep's pruning, if any (another process timing it: said, then waited for)
    plan = pruned_plan(recipe, plan_candidates(recipe), lambda: say_held(SWEEP_HELD, store, progress))
    seeds = recipe.budget.seeds
    jobs = [(c, s) for c in plan.candidates for s in seeds]
    failed_starts.reopen(store, progress)
    _check_finished_runs_match(store, plan)
    keep_recipe(store, recipe)  # the recipe a resume edited (its candidates, say): `recommend` reads it
    todo = [(c, s) for c, s in jobs if not store.is_finished(run_id(c, s))]
    if progress is not None:
        progress("plan", {"total": len(jobs), "todo": len(todo), "max_samples": recipe.budget.max_samples})
    ref_jobs = [(c, s) for c, s in todo if c.label == plan.reference]
    rest = [(c, s) for c, s in todo if c.label != plan.reference]
    ref_b = plan.reference_batch
    # one run at a time: the reference's first seed alone, so a trainer that cannot start stops
    # the probe after one attempt (at once in parallel: no seed waits for another)
    one_by_one = recipe.run.executor != "ray" and recipe.run.workers == 1
    rounds = [ref_jobs[:1], ref_jobs[1:]] if one_by_one else [ref_jobs]
    no_band = stop_policy(recipe, NO_BAND)
    done = 0
    ref_cand = plan.by_label()[plan.reference]
    with lifeguard.sigterm_raises():  # SIGTERM unwinds: pool workers and trainers are stopped
        try:
            # waits for reference runs another live process holds: the band needs every seed
            for batch in rounds:
                done += run_jobs(execute_run, recipe, store, ref_b, batch, no_band, progress)
                records = [r for sd in seeds if (r := store.run(run_id(ref_cand, sd))) is not None]
                who = f"the reference {plan.reference}"
                failed_starts.stop_if_none_started(records, who, "no other batch was run")
        except (MetricMissingError, BackendError):
            if not store.runs():  # nothing finished: let a rerun with the right metric start afresh
                store.manifest_path.unlink(missing_ok=True)
            raise
        band = stop_policy(recipe, reference_band(store, recipe, plan))
        done += run_jobs(execute_run, recipe, store, ref_b, rest, band, progress)
        rounds_locks = (store.root / ROUNDS_LOCK, store.runs_dir / ROUNDS_LOCK)  # this order everywhere
        with locked_waiting(rounds_locks, lambda: say_held(ROUNDS_HELD, store, progress)):
            refinement, plan, n = refine_rounds(
                recipe, store, plan, _round_analysis(store, recipe), _round_runner(recipe, store, progress)
            )
            done += n
            plan = plan if refinement else stored_plan(recipe, store, plan)  # rounds of an earlier probe
            policy = lambda: stop_policy(recipe, reference_band(store, recipe, plan))  # noqa: E731
            done += add_seeds(recipe, store, plan, execute_run, analyse_store, policy, progress)
            done += add_async_seeds(recipe, store, plan, execute_run, analyse_store, policy, progress)
    efficiency = analyse_store(store, recipe, plan)
    note = failed_starts.note(store)
    return ProbeResult(
        plan=plan,
        efficiency=efficiency,
        runs_done=done,
        runs_skipped=len(jobs) - len(todo),
        wall_s=time.perf_counter() - t0,
        notes=(note,) if note else (),
        refinement=refinement,
    )


def say_held(message: str, store: ResultsStore, progress: ProgressFn | None) -> None:
    """Says (a "wait" event) that another process holds ``store``'s rounds or sweep lock."""
    if progress is not None:
        progress("wait", {"run_ids": [], "message": message.format(store.root)})


def _round_analysis(store: ResultsStore, recipe: Recipe) -> Callable[[Plan], SampleEfficiency]:
    return lambda plan: analyse_store(store, recipe, plan, planned_only=True)


def _round_runner(
    recipe: Recipe, store: ResultsStore, progress: ProgressFn | None
) -> Callable[[Plan, list[Candidate]], int]:
    """Runs a refinement round's candidates at every planned seed, banded by the reference."""

    def run(plan: Plan, cands: list[Candidate]) -> int:
        jobs = [(c, s) for c in cands for s in recipe.budget.seeds]
        todo = [(c, s) for c, s in jobs if not store.is_finished(run_id(c, s))]
        if progress is not None and todo:
            labels = ", ".join(c.label for c in cands)
            phase = f"refinement between grid points: {labels}"
            progress("plan", {"total": len(todo), "todo": len(todo), "max_samples": recipe.budget.max_samples,
                              "phase": phase})  # fmt: skip
        band = stop_policy(recipe, reference_band(store, recipe, plan))
        return run_jobs(execute_run, recipe, store, plan.reference_batch, todo, band, progress)

    return run
