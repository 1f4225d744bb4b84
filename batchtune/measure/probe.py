"""`batchtune probe`: short LR-scaled training runs at several batches, resumable (method.md §3, §7).

Order of work: the reference candidate first (all seeds), so every other run can stop as soon as it is
clearly outside the reference's tolerance band; then the rest, in local processes or on Ray. Each run
streams StepRecords into the results store; a run is finished when its run.json exists, so a probe
killed at any moment (even kill -9) and rerun redoes only unfinished runs, with the same answer.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchtune import backends
from batchtune.analysis.sample.curves import samples_to_target, target_confirmed
from batchtune.analysis.sample.efficiency import RunData, SampleEfficiency, analyse_runs
from batchtune.backends import lifeguard
from batchtune.backends.spec import Candidate, RunFailed, RunSpec
from batchtune.errors import AnalysisError, BackendError, InputError, MetricMissingError, RecipeError
from batchtune.events import ProbeEvents
from batchtune.measure import failed_starts, preflight
from batchtune.measure.async_sweep import pruned_plan
from batchtune.measure.execute import run_jobs
from batchtune.measure.guards import check_metric_present, check_target_range
from batchtune.measure.plan import Plan, plan_candidates, run_id, run_record
from batchtune.measure.sequential import add_seeds, with_extra_seeds
from batchtune.recipe.checks import another_recipe
from batchtune.recipe.load import recipe_from_dict
from batchtune.recipe.schema import PretrainConfig, Recipe
from batchtune.records import ResultsStore, RunRecord, failed_before_training
from batchtune.store_paths import contained

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

ProgressFn = ProbeEvents


@dataclass(frozen=True)
class StopPolicy:
    metric: str
    target: float
    higher_is_better: bool
    ema_alpha: float
    max_samples: int
    stop_at_target: bool
    band_samples: float  # stop when past this many samples without reaching the target; inf = never
    origin_samples: int = 0  # branched probes: the target is judged on samples counted from here
    # ...and past this many seconds of its own step times (0: the sample band alone, no timings)
    band_time_s: float = 0.0
    other_s_per_step: float = 0.0  # the recipe's per-step overhead, as the ranking adds it


@dataclass(frozen=True)
class ProbeResult:
    plan: Plan
    efficiency: SampleEfficiency
    runs_done: int  # runs executed by this invocation
    runs_skipped: int  # finished earlier and reused
    wall_s: float
    plot_path: Path | None = None  # the learning-curve plot, drawn by the workflow
    notes: tuple[str, ...] = ()  # e.g. a plot that could not be written (a read-only directory)


def _defining(recipe: Recipe) -> dict[str, Any]:
    data = recipe.to_dict()
    out: dict[str, Any] = {k: data[k] for k in _RUN_DEFINING}
    for section, keys in _RUN_DEFINING_KEYS.items():
        out[section] = {k: data[section][k] for k in keys}
    return out


def check_manifest(store: ResultsStore, recipe: Recipe) -> None:
    """Write the manifest, or refuse to mix runs of a different recipe into an existing directory."""
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
        raise InputError(
            f"{store.root} holds a probe of a different recipe (changed: {', '.join(diffs[:6])}); "
            "use another --results directory, or delete it to start over"
        )


def _only_failed_runs(store: ResultsStore) -> bool:
    """Whether the store holds runs and every one of them failed (status ``failed``)."""
    runs = store.runs()
    return bool(runs) and all(r.status == "failed" for r in runs)


def _stop_policy(recipe: Recipe, band: tuple[float, float]) -> StopPolicy:
    t = recipe.target
    return StopPolicy(
        metric=t.metric,
        target=t.value,
        higher_is_better=t.higher_is_better,
        ema_alpha=t.ema_alpha,
        max_samples=recipe.budget.max_samples,
        stop_at_target=recipe.budget.stop_at_target,
        band_samples=band[0] if recipe.budget.stop_outside_band else math.inf,
        band_time_s=band[1],
        other_s_per_step=recipe.generation.other_s_per_step,
    )


def execute_run(
    recipe: Recipe,
    results_dir: str,
    candidate: Candidate,
    seed: int,
    base_lr: float,
    reference_batch: int,
    policy: StopPolicy,
    rid: str | None = None,
    spec_extra: dict[str, Any] | None = None,
    events: Any = None,
    *,
    parallel_runs: int = 1,
) -> RunRecord | None:
    """Run one candidate at one seed into the store. Returns None if it was finished or taken.

    Runs in the caller's process, in a worker, a Ray task or a Ray Job (its arguments by position,
    as JSON for a job); ``events`` is a queue-like object with ``put`` (or a callable) that receives
    progress dicts. Branched probes and schedule runs pass their own ``rid`` and ``spec_extra``
    (RunSpec's resume_from / save_at_samples / checkpoint_dir; paths and tuples that travelled as
    JSON strings and lists are read back). ``parallel_runs`` (runs sharing this machine with it,
    itself included) is stored with the record, so its step times can be read as contended or not.
    """
    store = ResultsStore(results_dir)
    rid = rid or run_id(candidate, seed)
    extra = dict(spec_extra or {})
    for key in ("resume_from", "checkpoint_dir"):
        if extra.get(key) is not None:
            extra[key] = contained(store.root, Path(extra[key]))  # never through a link out
    if "save_at_samples" in extra:
        extra["save_at_samples"] = tuple(int(v) for v in extra["save_at_samples"])

    def emit(kind: str, **info: Any) -> None:
        if events is None:
            return
        payload = {"kind": kind, "run_id": rid, **info}
        if callable(events):
            events(kind, payload)
        else:
            events.put(payload)

    with store.claim(rid) as writer:
        if writer is None:
            return None
        spec = RunSpec(
            run_id=rid,
            candidate=candidate,
            seed=seed,
            recipe=recipe,
            run_dir=store.run_dir(rid),
            base_lr=base_lr,
            reference_batch=reference_batch,
            **extra,
        )
        backend = backends.load("training", recipe.backend.training)()
        emit("start", label=candidate.label, seed=seed)
        t0 = time.perf_counter()
        samples_seen: list[float] = []
        values: list[float] = []
        raw_reached = False  # the fit cannot reach the target before a raw point does
        last = None
        totals = {"gen_s": 0.0, "train_s": 0.0, "other_s": 0.0}
        unit = recipe.sample_unit
        status, reason = "budget_exhausted", f"spent the budget of {policy.max_samples} {unit}"
        failed_start = False
        stream = backend.train(spec)
        logged: set[str] = set()  # metric names seen until the target metric shows up
        try:
            for step in stream:
                writer.append(step)
                if policy.metric not in logged:
                    logged.update(step.metrics)  # raises below if the target metric is missing
                    check_metric_present(policy.metric, step.metrics, logged)
                last = step
                for key in totals:
                    totals[key] += getattr(step, key)
                emit("step", samples=step.samples, max_samples=policy.max_samples)
                value = step.metrics.get(policy.metric)
                bad = [k for k, v in step.metrics.items() if not math.isfinite(v)]
                if step.grad_norm is not None and not math.isfinite(step.grad_norm):
                    bad.append("grad_norm")
                if bad:
                    status, reason = "diverged", f"{', '.join(bad)} not finite at step {step.step}"
                    break
                if value is not None:
                    samples_seen.append(step.samples - policy.origin_samples)
                    values.append(value)
                    hit = value >= policy.target if policy.higher_is_better else value <= policy.target
                    raw_reached = raw_reached or hit
                    if policy.stop_at_target and raw_reached:
                        crossing = samples_to_target(
                            samples_seen,
                            values,
                            policy.target,
                            higher_is_better=policy.higher_is_better,
                            ema_alpha=policy.ema_alpha,
                        )
                        if target_confirmed(crossing):  # 25% past R: no end-of-curve bias
                            status = "reached_target"
                            reason = f"reached the target at {crossing.samples_to_target:.0f} {unit}"
                            break
                train_time_s = totals["gen_s"] + totals["train_s"] + step.step * policy.other_s_per_step
                if step.samples >= policy.band_samples and train_time_s >= policy.band_time_s:
                    status = "stopped_outside_band"
                    reason = (
                        f"no target after {step.samples} samples, past the reference band "
                        f"({policy.band_samples:.0f})"
                    )
                    break
                if step.samples >= policy.max_samples:
                    break
        except (MetricMissingError, BackendError):
            raise  # the recipe or the environment is wrong for every run (no GPU, a module): not data
        except RunFailed as exc:
            status, reason, failed_start = exc.status, exc.message, not exc.started
        except MemoryError:
            status, reason = "oom", "host out of memory"
        except Exception as exc:  # a backend bug or a user's reward function: data, not a crash
            status, reason = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            stream.close()
        record = run_record(
            candidate,
            seed,
            base_lr,
            reference_batch,
            status,
            reason,
            rid=rid,
            steps=last.step if last else 0,
            samples=last.samples if last else 0,
            tokens=last.tokens if last else 0,
            wall_s=time.perf_counter() - t0,
            backend=recipe.backend.training,
            parallel_runs=parallel_runs,
            cpu_cores=os.cpu_count() or 0,
            failed_start=failed_start and last is None,
            **totals,  # gen_s / train_s / other_s
        )
        writer.finish(record)
        emit("end", status=status, reason=reason)
        return record


def load_run_data(store: ResultsStore) -> list[RunData]:
    """The finished runs the analysis reads: not those that failed before training (not data)."""
    return [
        RunData(rec, tuple(store.steps(rec.run_id)))
        for rec in store.runs()
        if not failed_before_training(rec)
    ]


def analyse_store(store: ResultsStore, recipe: Recipe, plan: Plan | None = None) -> SampleEfficiency:
    if store.runs_dir.exists() and not store.runs_dir.is_dir():
        raise InputError(f"{store.runs_dir} is a file, not the runs folder: move it away")
    runs = load_run_data(store)
    if not runs:
        branched = store.root / "branched"  # measure.branched's store: its runs are read in that mode
        if not recipe.study.branched and branched.is_dir() and any(branched.iterdir()):
            raise InputError(
                f"{store.root} holds a branched probe's runs and no grid runs: add "
                "--set probe.mode=branched (or set it in the recipe)"
            )
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
    return with_extra_seeds(eff, runs, recipe.budget.seeds)


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


def _band_samples(store: ResultsStore, recipe: Recipe, plan: Plan) -> float:
    """Samples past which a candidate is clearly outside the band (`_reference_band`)."""
    return _reference_band(store, recipe, plan)[0]


def _band_time_s(store: ResultsStore, recipe: Recipe, plan: Plan) -> float:
    """Seconds of training past which a candidate is clearly slower than the reference."""
    return _reference_band(store, recipe, plan)[1]


def _reference_band(store: ResultsStore, recipe: Recipe, plan: Plan) -> tuple[float, float]:
    """(samples, seconds) past which a candidate that has not reached the target is clearly out.

    Samples: band_factor * (1+tol) * R_ref (upper CI), which settles the verdict ("deviates").
    Seconds: the same factor times R_ref / Θ_ref (Θ_ref from the reference's step times), since a
    batch needing more samples can still win on time (docs/method.md §1; the samples band alone
    censored the fastest batch of NQM `sqrt-rule`). 0 s without step times: the samples band alone.
    None from a partial reference (a seed unfinished, held elsewhere or failed to start)."""
    none = (math.inf, math.inf)
    ref = plan.by_label().get(plan.reference)
    if ref is None or not all(store.is_finished(run_id(ref, s)) for s in recipe.budget.seeds):
        return none
    try:
        eff = analyse_store(store, recipe, plan)
        cand = eff.get(plan.reference)
    except (AnalysisError, KeyError):
        return none
    est = cand.estimate
    if est is None or not math.isfinite(est.ci_high):
        return none
    factor = recipe.budget.band_factor * (1 + recipe.target.tolerance)
    step_s = cand.gen_s_per_step + cand.train_s_per_step
    step_s += recipe.generation.other_s_per_step if step_s > 0 else 0.0
    return factor * est.ci_high, factor * est.ci_high / cand.batch_responses * step_s


def run_probe(
    recipe: Recipe, results_dir: str | Path | None = None, progress: ProgressFn | None = None
) -> ProbeResult:
    """Run (or resume) the probe of ``recipe`` into ``results_dir`` and analyse it."""
    t0 = time.perf_counter()
    store = ResultsStore(results_dir or recipe.run.results_dir)
    check_target_range(recipe)
    preflight.check(recipe)  # task, prompts file, reward import, command placeholders: before any write
    check_manifest(store, recipe)
    plan = pruned_plan(recipe, plan_candidates(recipe))  # the auto off-policy sweep's pruning, if any
    seeds = recipe.budget.seeds
    jobs = [(c, s) for c in plan.candidates for s in seeds]
    failed_starts.reopen(store, progress)
    _check_finished_runs_match(store, plan)
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
    no_band = _stop_policy(recipe, (math.inf, math.inf))
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
        band = (_band_samples(store, recipe, plan), _band_time_s(store, recipe, plan))
        done += run_jobs(execute_run, recipe, store, ref_b, rest, _stop_policy(recipe, band), progress)
        policy = lambda: _stop_policy(  # noqa: E731
            recipe, (_band_samples(store, recipe, plan), _band_time_s(store, recipe, plan))
        )
        done += add_seeds(recipe, store, plan, execute_run, analyse_store, policy, progress)
    efficiency = analyse_store(store, recipe, plan)
    note = failed_starts.note(store)
    return ProbeResult(
        plan=plan,
        efficiency=efficiency,
        runs_done=done,
        runs_skipped=len(jobs) - len(todo),
        wall_s=time.perf_counter() - t0,
        notes=(note,) if note else (),
    )


def replace_results_dir(recipe: Recipe, results_dir: str | None) -> Recipe:
    if not results_dir:
        return recipe
    return dataclasses.replace(recipe, run=dataclasses.replace(recipe.run, results_dir=results_dir))
