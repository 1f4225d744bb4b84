"""`batchtune recommend` (and `tune`, `report`, `check`): the recommendation from a results
directory or a measurements file, with its throughput source, plot and emitted trainer config."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchtune.analysis.decide.recommend import (
    Recommendation,
    ThroughputModel,
    recommend,
    throughput_from_probe,
    throughput_from_profile,
)
from batchtune.analysis.sample.efficiency import SampleEfficiency
from batchtune.analysis.system.hardware import SIMULATED_DEVICE
from batchtune.analysis.system.profile import analyse_throughput
from batchtune.errors import AnalysisError, InputError, NotRanked, ThroughputMissing
from batchtune.integrations.emit_base import DEFAULT_GPUS_PER_NODE
from batchtune.measure.async_topup import has_async_knobs
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore
from batchtune.records.types import RunRecord
from batchtune.workflow.loading import load, results_is_a_folder
from batchtune.workflow.pretrain import check_pretrain_ranking, emit_pretrain_pick

if TYPE_CHECKING:
    from batchtune.measure.branched import BranchedProbeResult


def plot_skipped(what: str, exc: OSError) -> str:
    return f"{what} plot not written ({exc.strerror or exc}: {exc.filename or 'the plots directory'})"


SIMULATED_TIMINGS = "probe timings (simulated)"  # the NQM's: computed seconds, said wherever shown


def throughput_for(
    cfg: Recipe, store: ResultsStore, eff: Any, source: str, runs: list[RunRecord] | None = None
) -> ThroughputModel:
    """The throughput model ``source`` names; from the probe's own step times, flagged where runs
    shared the machine (``runs``: the probe's runs, default the store's; a branched probe's live
    under its own store)."""
    if source not in ("auto", "profile", "probe"):
        raise InputError(f"--throughput {source!r}: choose auto, profile or probe")
    if cfg.study.pretrain:  # no generation: a step is the probe's own training step
        if source == "profile":
            raise InputError("--throughput profile: a pre-training recipe generates nothing; use probe")
        source = "probe"
    other = cfg.generation.other_s_per_step
    if source in ("auto", "profile"):
        points = store.throughput()  # the latest profile of the directory, with its stored model shape
        profile = (
            analyse_throughput(points, cfg, model_info=store.model_info(points[-1].profile_id))
            if points
            else None
        )
        model = throughput_from_profile(profile, eff.candidates, other)
        if model is not None and profile is not None:
            where = points[-1].hardware or "this machine"
            load = profile.other_cores
            if profile.device == SIMULATED_DEVICE:  # computed, not timed: no load to speak of
                return dataclasses.replace(model, source=f"profile-gen on {where}")
            if model.caveats:
                how = f"contended: other processes on {load:.1f} of {profile.cpu_cores} cores"
            elif math.isfinite(load):
                how = f"timed alone (other processes on {load:.1f} cores)"
            else:
                how = "timed alone"
            return dataclasses.replace(model, source=f"profile-gen on {where}, {how}")
        if source == "profile":
            raise InputError(
                f"{store.root} has no generation and training profile; run `batchtune profile-gen` first"
            )
    parallel: dict[str, int] = {}
    probed: set[str] = set()  # candidates with a run of batchtune's own (not imported from a log)
    every = store.runs() if runs is None else runs
    for run in every:  # the most runs that shared the machine with any run of a candidate
        parallel[run.candidate] = max(parallel.get(run.candidate, 0), run.parallel_runs)
        if not run.imported:
            probed.add(run.candidate)
    logged = {run.candidate for run in every} - probed
    pretrain = cfg.study.pretrain
    model = throughput_from_probe(eff.candidates, other, parallel, profile=not pretrain, logged_other=logged)
    if cfg.backend.training == "nqm":  # its step times are computed from a time model, not measured
        model = dataclasses.replace(model, source=model.source.replace("probe timings", SIMULATED_TIMINGS))
    return model


def recommend_for_recipe(
    cfg: Recipe,
    throughput: str,
    emit: str | None,
    gpus: int,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    *,
    plot: bool = True,
    command: str = "recommend",
) -> tuple[Recommendation, str | None, Any]:
    """The recommendation from a recipe's results directory; ``plot`` writes the time-to-target plot
    there (a read-only gate such as `check` passes False: it must not write into the evidence);
    ``command``: the one the user ran, for its messages (report, check)."""
    check_pretrain_ranking(cfg, command, emit)
    store = ResultsStore.of(cfg)
    if not store.exists():
        raise InputError(
            f"no results in {store.root}: run `batchtune probe` first (or name another results directory)"
        )
    eff, branched = _efficiency(cfg, store)
    try:
        probe_runs = (
            None if branched is None else [r.record for r in (branched.runs.trunk, *branched.runs.branches)]
        )
        thr = throughput_for(cfg, store, eff, throughput, probe_runs)
    except AnalysisError as exc:  # the critical batch needs no throughput: keep it, say what would rank
        raise ThroughputMissing(
            f"no time-to-target ranking: {exc}. The ranking needs a throughput source: "
            "`batchtune profile-gen` on the training hardware, timing columns in the imported logs "
            "(--map gen_s=KEY --map train_s=KEY), or --throughput probe after a probe that timed its steps",
            eff,
        ) from None
    if branched is None:
        rec = _with_logged_updates(_ranked(cfg, store, eff, thr, gpus), store.runs())
    else:
        rec = _ranked_branched(cfg, eff, thr, branched)
    if plot:
        try:  # best effort, as the probe's plot
            note = f"time-to-target plot: {plot_time(store.plots_dir, rec)}"
        except OSError as exc:
            note = plot_skipped("time-to-target", exc)
        rec = dataclasses.replace(rec, notes=(*rec.notes, note))
    return _emit(rec, emit, gpus, cfg, gpus_per_node)


def _efficiency(cfg: Recipe, store: ResultsStore) -> tuple[SampleEfficiency, BranchedProbeResult | None]:
    """The sample efficiency of the results (and the branched probe's result, where it is one)."""
    if cfg.study.branched:
        from batchtune.measure.branched import run_branched_probe

        branched = run_branched_probe(cfg, read_only=True)
        return branched.efficiency, branched
    from batchtune.measure.probe import analyse_store
    from batchtune.measure.rl_refine import stored_plan

    plan = stored_plan(cfg, store)  # the recipe's candidates and those its refinement rounds added
    planned = set(plan.by_label())
    # the probe's runs of a candidate the recipe dropped are left out (as the probe's analysis does);
    # imported runs outside the plan are ranked, without it
    labels = {r.candidate for r in store.runs() if r.imported or r.candidate in planned}
    use_plan = labels <= planned and plan.reference in labels
    return analyse_store(store, cfg, plan if use_plan else None, recipe_plan=plan), None


def _ranked(
    cfg: Recipe, store: ResultsStore, eff: SampleEfficiency, thr: ThroughputModel, gpus: int = 0
) -> Recommendation:
    """The grid's ranking, joint with the async candidates where the recipe sweeps them (and their
    rollout:train split of ``gpus`` GPUs, modelled)."""
    joint = None
    if has_async_knobs(cfg):  # only then: the sync path never reaches the async machinery
        from batchtune.workflow.joint import joint_for, with_pick

        joint, thr = joint_for(cfg, store, eff, thr, gpus)
    try:
        rec = recommend(eff, thr)
    except AnalysisError as exc:
        from batchtune.measure.advice import why_not_ranked

        raise NotRanked(why_not_ranked(str(exc), store, cfg, eff), eff) from None
    return rec if joint is None else with_pick(rec, joint, cfg)


def _with_logged_updates(rec: Recommendation, runs: list[RunRecord]) -> Recommendation:
    """``rec`` with the u its winner's runs were imported at, where all of them were: the config
    emitted for it trains at that u, not at the recipe's mini-batches (import-logs writes 1)."""
    own = [r for r in runs if r.candidate == rec.winner.label]
    if not own or not all(r.imported for r in own):
        return rec
    return dataclasses.replace(rec, logged_updates=min(r.updates_per_batch for r in own))


def _ranked_branched(
    cfg: Recipe, eff: SampleEfficiency, thr: ThroughputModel, branched: BranchedProbeResult
) -> Recommendation:
    """The branched ranking, with what the search left unmeasured and a batch schedule from the
    critical batch's progress."""
    from batchtune.analysis.branched.summary import with_schedule
    from batchtune.measure.branched import thin_evidence, unmeasured

    joint = None
    if has_async_knobs(cfg) and branched.runs.offpolicy is not None:  # off-policy branches: rank them
        from batchtune.measure.branched import branched_store
        from batchtune.workflow.joint import joint_for, with_pick

        joint, thr = joint_for(cfg, branched_store(cfg.run.results_dir), eff, thr)
    rec = recommend(eff, thr, unmeasured=unmeasured(branched), caveats=thin_evidence(branched))
    rec = with_schedule(rec, branched.summary, cfg.target.tolerance)
    return rec if joint is None else with_pick(rec, joint, cfg)


def plot_time(plots_dir: Path, rec: Recommendation) -> Path:
    from batchtune.report.plots_time import TIME_PLOT, plot_time_to_target

    return plot_time_to_target(rec, plots_dir / TIME_PLOT)


def recommend_from_args(
    recipe: str | None = None,
    *,
    overrides: list[str] | None = None,
    results: str | None = None,
    measurements: Path | None = None,
    throughput: str = "auto",
    emit: str | None = None,
    gpus: int = DEFAULT_GPUS_PER_NODE,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    plot: bool = True,
    command: str = "recommend",
) -> tuple[Recommendation, str | None, Any]:
    if measurements is not None:
        if results is not None:
            raise InputError("give either --measurements or --results, not both")
        from batchtune.integrations.measurements import (
            assess_measurements,
            load_measurements,
            throughput_from_measurements,
        )

        m = load_measurements(measurements)
        rec = recommend(assess_measurements(m), throughput_from_measurements(m))
        if emit is None:
            return rec, None, None
        from batchtune.integrations.emit import emit as emit_config
        from batchtune.integrations.emit import recommendation_input

        winner = next(mc for mc in m.candidates if mc.efficiency.label == rec.winner.label)
        base = recommendation_input(rec, None)
        spec = dataclasses.replace(base, algorithm=m.study.algorithm, critic_lr=winner.critic_lr or 0.0)
        out = emit_config(emit, spec, gpus, gpus_per_node=gpus_per_node)
        return rec, out.text, out.values
    cfg = results_is_a_folder(load(recipe, list(overrides or []), results, stored=True))
    return recommend_for_recipe(cfg, throughput, emit, gpus, gpus_per_node, plot=plot, command=command)


def _emit(
    rec: Recommendation, trainer: str | None, gpus: int, cfg: Recipe | None, gpus_per_node: int
) -> tuple[Recommendation, str | None, Any]:
    """``rec`` with its config emitted for ``trainer`` (None: none); where the trainer took another
    modelled split than the async pick's, ``rec``'s pick is the one emitted, so run_as says it."""
    if trainer is None:
        return rec, None, None
    if cfg is not None and cfg.study.pretrain:
        return rec, emit_pretrain_pick(rec, trainer, gpus, cfg), {}
    from batchtune.integrations.emit import emit_for_recommendation

    out = emit_for_recommendation(rec, trainer, gpus, cfg, gpus_per_node=gpus_per_node)
    if out.pick is not None and rec.async_decision is not None:
        rec = dataclasses.replace(rec, async_decision=dataclasses.replace(rec.async_decision, pick=out.pick))
    from batchtune.integrations.emit_schedule import schedule_appendix  # "" without a schedule

    appendix = schedule_appendix(trainer, rec, cfg, gpus, gpus_per_node=gpus_per_node)
    out = dataclasses.replace(out, text=out.text + appendix)
    concurrency = rec.winner_throughput.generation_concurrency
    if cfg is not None and concurrency and rec.throughput.source.startswith("profile"):
        from batchtune.analysis.system.roofline import KNOWN_HARDWARE
        from batchtune.integrations.emit_files import hardware_caveat

        points = ResultsStore.of(cfg).throughput()
        where = points[-1].hardware if points else ""
        caveat = hardware_caveat(where, concurrency, tuple(KNOWN_HARDWARE))
        return rec, out.text + f"# {caveat}\n", out.values
    return rec, out.text, out.values


def write_emitted(trainer: str, text: str, values: dict[str, object], out: Path) -> Path:
    """``--emit TRAINER --out FILE``: the emitted config as a file the trainer takes as it is."""
    from batchtune.integrations.emit_files import write_trainer_file

    return write_trainer_file(trainer, values, text, out)
