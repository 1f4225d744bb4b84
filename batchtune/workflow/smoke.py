"""The workflow of `smoke`: the whole pipeline (probe, profile, recommend) at its smallest sizes.
Inputs in, a result object out, no printing."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from batchtune.errors import AnalysisError, InputError
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore
from batchtune.workflow.loading import load
from batchtune.workflow.recommend import recommend_for_recipe


@dataclasses.dataclass(frozen=True)
class SmokeStage:
    """One stage of a smoke run: status ok | failed | skipped, what it did or why not, its wall time."""

    name: str
    status: str
    detail: str
    wall_s: float


@dataclasses.dataclass(frozen=True)
class SmokeResult:
    recipe: str
    results_dir: str
    reduced: tuple[str, ...]  # what ran only at smoke size
    stages: tuple[SmokeStage, ...]
    wall_s: float
    unchecked: tuple[str, ...] = ()  # what this smoke could not check here at all

    @property
    def ok(self) -> bool:
        return all(s.status != "failed" for s in self.stages)


class _FirstRunFailed(Exception):
    """Raised from the probe's progress callback: smoke stops at the first failed run (the next one
    would most likely fail the same way, and a trainer's start-up can take a minute)."""

    def __init__(self, info: dict[str, Any]):
        super().__init__(info.get("run_id"))
        self.info = info

    def as_error(self) -> AnalysisError:
        from batchtune.errors import RunsFailed

        i = self.info
        return RunsFailed(
            f"run {i.get('run_id')} {i.get('status')}: {i.get('reason') or 'no reason given'} "
            "(smoke stops at the first failed run; keep its logs with --results DIR)"
        )


def smoke(recipe: str | None, overrides: list[str], results: str | None) -> SmokeResult:
    """Probe, profile and recommend on the recipe at its smallest sizes (recipe/smoke.py), in a
    temporary results directory unless ``results`` is given. A run that fails fails the probe stage
    at once, with its own reason; a stage the recipe cannot run here is skipped with why. Analysis
    that the tiny budget cannot support (the target not reached) is a skip, not a failure: smoke
    proves the pipeline runs, not what it finds."""
    import shutil
    import tempfile
    import time

    from batchtune.errors import BatchtuneError, RunsFailed
    from batchtune.measure.probe import run_probe
    from batchtune.measure.profile import run_profile
    from batchtune.recipe.smoke import smoke_recipe

    t0 = time.perf_counter()
    tmp = None if results else tempfile.mkdtemp(prefix="batchtune-smoke-")
    plan = smoke_recipe(load(recipe, overrides), results or str(tmp))
    cfg = plan.recipe
    stages: list[SmokeStage] = []

    def stage(name: str, fn: Any) -> Any:
        if name in plan.skip:
            stages.append(SmokeStage(name, "skipped", plan.skip[name], 0.0))
            return None
        t = time.perf_counter()
        try:
            detail, value = fn()
        except RunsFailed as exc:  # every run failed for a reason of its own: that is the answer
            stages.append(SmokeStage(name, "failed", str(exc), time.perf_counter() - t))
            return None
        except AnalysisError as exc:
            stages.append(
                SmokeStage(name, "skipped", f"ran, but the smoke budget cannot support it: {exc}", 0.0)
            )
            return None
        except BatchtuneError as exc:
            stages.append(SmokeStage(name, "failed", str(exc), time.perf_counter() - t))
            return None
        stages.append(SmokeStage(name, "ok", detail, time.perf_counter() - t))
        return value

    try:
        probe = stage("probe", lambda: _smoke_probe(cfg, run_probe, plan.two_process))
        branches = plan.branches
        if branches is not None and probe is None:  # no trainer that ran: nothing to resume
            stages.append(SmokeStage("branches", "skipped", "needs a probe stage that ran", 0.0))
        elif branches is not None:  # a branched recipe: its trunk saves, its branches resume
            stage("branches", lambda: _smoke_branches(branches))
        two_process = plan.two_process
        if two_process is not None and probe is None:  # its trainer did not run in one process
            stages.append(SmokeStage("two-process", "skipped", "needs a probe stage that ran", 0.0))
        elif two_process is not None:  # an async recipe: one run as a rollout process and the trainer
            stage("two-process", lambda: _smoke_two_process(two_process))
        stage("profile-gen", lambda: _smoke_profile(cfg, run_profile))
        if probe is None:
            stages.append(SmokeStage("recommend", "skipped", "needs the probe's results", 0.0))
        else:
            stage("recommend", lambda: _smoke_recommend(cfg))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    where = results or "a temporary directory (removed)"
    return SmokeResult(
        cfg.source, where, plan.reduced, tuple(stages), time.perf_counter() - t0, plan.unchecked
    )


def _stop_at_failure(kind: str, info: dict[str, Any]) -> None:
    from batchtune.records.types import FAILED_STATUSES

    if kind == "end" and info.get("status") in FAILED_STATUSES:
        raise _FirstRunFailed(info)


def _smoke_probe(cfg: Recipe, run_probe: Any, two_process: Recipe | None = None) -> tuple[str, Any]:
    if two_process is not None:  # an async recipe probed in one process: its async checks first
        from batchtune.measure import preflight

        preflight.check(two_process)
    if cfg.study.pretrain:
        return _smoke_pretrain(cfg)
    try:
        result = run_probe(cfg, _stop_at_failure)
    except _FirstRunFailed as stop:
        raise stop.as_error() from None
    eff = result.efficiency
    metrics = f"metric {eff.metric!r} logged" if all(c.estimate for c in eff.candidates) else "no metric"
    runs = f"{result.runs_done} run(s) of {', '.join(c.label for c in eff.candidates)}"
    return f"{runs} on the {cfg.backend.training} backend: {metrics}", result


def _smoke_pretrain(cfg: Recipe) -> tuple[str, Any]:
    from batchtune.measure.pretrain_probe import run_pretrain_probe

    try:
        result = run_pretrain_probe(cfg, _stop_at_failure)  # the grid's runs, no refinement rounds
    except _FirstRunFailed as stop:
        raise stop.as_error() from None
    labels = ", ".join(c.label for c in result.candidates)
    return f"{result.runs_done} pre-training run(s) of {labels}: grid analysed", result


def _smoke_branches(cfg: Recipe) -> tuple[str, Any]:
    """The checkpoint path at its smallest, in a scratch folder of the results (emptied first: a
    smoke is never resumed, and its settings may have changed): a one-step trunk at the smallest
    batch saves its checkpoint, then one run of every batch resumes from it for one step of its
    own; each must finish and log its steps past the checkpoint. For the built-in trainers that
    shows the state was restored; the command backend counts a resumed trainer's steps from the
    checkpoint itself, so for it this checks the checkpoint file and the save/resume arguments, not
    that the trainer continued the trunk's weights (said under "not checked here")."""
    import shutil

    from batchtune import backends
    from batchtune.backends.spec import checkpoint_path
    from batchtune.errors import RunsFailed
    from batchtune.measure.branched import branched_recipe
    from batchtune.measure.one_run import execute_run
    from batchtune.measure.plan import plan_candidates
    from batchtune.measure.stop_rule import StopPolicy
    from batchtune.records.types import FAILED_STATUSES

    problem = backends.checkpoint_problem(cfg)
    if problem is not None:  # before any trainer starts
        raise InputError(f"{problem}, so probe.mode = 'branched' cannot use it")
    where = Path(cfg.run.results_dir) / "branches"
    shutil.rmtree(where, ignore_errors=True)
    cfg = branched_recipe(cfg.with_results_dir(where))
    plan = plan_candidates(cfg)
    main = [plan.by_label()[lab] for lab in plan.main]
    ref, seed, t = main[0], cfg.budget.seeds[0], cfg.target
    b0, ckpts, store = ref.batch_responses, where / "checkpoints", ResultsStore(where)

    def run(cand: Any, rid: str, end: int, extra: dict[str, Any]) -> tuple[Any, list[Any]]:
        policy = StopPolicy(t.metric, t.value, t.higher_is_better, t.ema_alpha, end, False, math.inf)
        at_end = dataclasses.replace(cfg, budget=dataclasses.replace(cfg.budget, max_samples=end))
        lr, ref_batch = cfg.optimizer.lr, plan.reference_batch
        try:
            execute_run(at_end, str(where), cand, seed, lr, ref_batch, policy, rid, extra, _stop_at_failure)
        except _FirstRunFailed as stop:
            raise stop.as_error() from None
        return store.run(rid), store.steps(rid)

    save = {"save_at_samples": (b0,), "checkpoint_dir": ckpts}
    trunk, _ = run(ref, f"trunk-{ref.label}-s{seed}", b0, save)
    if trunk is None or trunk.status in FAILED_STATUSES or trunk.samples < b0:
        raise RunsFailed(f"the one-step trunk did not finish: {trunk.reason if trunk else 'no record'}")
    resume = {"resume_from": checkpoint_path(ckpts, b0)}
    for cand in main:
        rid = f"c{b0}-{cand.label}-s{seed}"
        rec, steps = run(cand, rid, b0 + cand.batch_responses, resume)
        if rec is None or rec.status in FAILED_STATUSES or not steps or steps[0].samples <= b0:
            why = (
                rec.reason if rec else ""
            ) or f"its first step is at {steps[0].samples if steps else 'none'}"
            raise RunsFailed(f"run {rid} did not resume from the checkpoint at {b0} {cfg.sample_unit}: {why}")
    labels = ", ".join(c.label for c in main)
    return (
        f"a one-step trunk at {b0} saved a checkpoint; a step of each of {labels} resumed from it",
        None,
    )


def _smoke_two_process(cfg: Recipe) -> tuple[str, Any]:
    """One run of the smallest batch as an async recipe runs it, a rollout worker process beside the
    trainer, at the least staleness k > 0 of its sweep (else on-policy), in a scratch folder of the
    results: it must finish, and its steps carry the worker's timers (a two-process step's record)."""
    import shutil

    from batchtune.errors import RunsFailed
    from batchtune.measure.one_run import execute_run
    from batchtune.measure.plan import plan_candidates
    from batchtune.measure.stop_rule import StopPolicy
    from batchtune.records.types import FAILED_STATUSES

    where = Path(cfg.run.results_dir) / "two-process"
    shutil.rmtree(where, ignore_errors=True)
    plan = plan_candidates(cfg)
    by, t, seed = plan.by_label(), cfg.target, cfg.budget.seeds[0]
    main = by[plan.main[0]]
    stale = [by[lab] for lab in plan.offpolicy if by[lab].prompts == main.prompts and by[lab].staleness > 0]
    cand = min(stale, key=lambda c: (c.staleness, c.updates_per_batch), default=main)
    end = cfg.budget.max_samples
    policy = StopPolicy(t.metric, t.value, t.higher_is_better, t.ema_alpha, end, False, math.inf)
    rid = f"{cand.label}-s{seed}"
    try:
        execute_run(cfg, str(where), cand, seed, cfg.optimizer.lr, plan.reference_batch, policy, rid, None,
                    _stop_at_failure)  # fmt: skip
    except _FirstRunFailed as stop:
        raise stop.as_error() from None
    store = ResultsStore(where)
    rec, steps = store.run(rid), [s for s in store.steps(rid) if "queue_wait_s" in s.metrics]
    if rec is None or rec.status in FAILED_STATUSES or not steps:
        why = (rec.reason if rec else "") or "no step came from the rollout worker"
        raise RunsFailed(f"the two-process run {rid} did not finish: {why}")
    k = f"staleness {cand.staleness}" if cand.staleness else "on-policy"
    return f"{rid} ({k}): {len(steps)} step(s) from a rollout worker process, trained beside it", None


def _smoke_profile(cfg: Recipe, run_profile: Any) -> tuple[str, Any]:
    result = run_profile(cfg, ResultsStore.of(cfg), None)
    n = sum(len(m.points) for m in result.modes.values())
    g = cfg.generation
    if g.backend == "simulated":
        what = "computed by the simulated engine (a notional 0.5B model, no engine)"
    else:
        what = f"measured on {g.backend} with {cfg.model.name}"
    return f"{n} generation point(s) {what}; training step time fit", result


def _smoke_recommend(cfg: Recipe) -> tuple[str, Any]:
    rec, _, _ = recommend_for_recipe(cfg, "auto", None, 8)
    return f"ranked {len(rec.ranking.candidates)} candidates (numbers meaningless at smoke size)", rec
