"""One function per command: inputs in, a result object out, no printing.

`cli.py` parses and renders; this module wires the layers below it: measure (probe, profile),
analysis (sample efficiency, throughput, recommendation), integrations (imports, emitters) and the
report layer's plots (files, not terminal output).
"""

from __future__ import annotations

import contextlib
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
from batchtune.analysis.system.profile import ProfileResult, RooflinePrediction, analyse_throughput
from batchtune.errors import AnalysisError, InputError, NotRanked, ThroughputMissing
from batchtune.events import ProbeEvents, SweepProgress
from batchtune.integrations.emit_base import DEFAULT_GPUS_PER_NODE
from batchtune.recipe.load import DEFAULT_RECIPE, apply_overrides, load_recipe, recipe_from_dict
from batchtune.recipe.schema import Recipe
from batchtune.records import FAILED_STATUSES, ResultsStore, RunRecord, atomic_write_text
from batchtune.workflow.joint import has_async_knobs
from batchtune.workflow.pretrain import check_pretrain_ranking, emit_pretrain_pick
from batchtune.workflow.study import Preview, ProbeOutcome, study_for

if TYPE_CHECKING:
    from batchtune.measure.branched import BranchedProbeResult
    from batchtune.measure.probe import ProbeResult


def recipe_for(recipe: str | None, overrides: list[str], results: str | None) -> Recipe:
    """The recipe named (or the default), with --set overrides and the results directory applied."""
    cfg = load_recipe(recipe or DEFAULT_RECIPE, overrides).with_results_dir(results)
    return _results_is_a_folder(cfg)


def _results_is_a_folder(cfg: Recipe) -> Recipe:
    """A results directory that is a file stopped later with "afile: File exists" or "afile/...: Not
    a directory"."""
    path = Path(cfg.run.results_dir)
    if path.exists() and not path.is_dir():
        raise InputError(f"results directory {path} is a file: give a folder with --results DIR")
    return cfg


def validate_recipe(recipe: str) -> Recipe:
    """Load ``recipe`` and run every check a probe would run before its first run (the backend's
    too: task, prompts file, reward import, command placeholders)."""
    from batchtune.measure import preflight

    cfg = load_recipe(recipe)
    preflight.check(cfg)
    return cfg


# ---- plan / probe --------------------------------------------------------------------------------


def plan_preview(cfg: Recipe, time_steps: int | None = None) -> Preview:
    """What the probe of ``cfg`` will cost, before running it (upper bounds; the study map says how).
    A recipe the probe would refuse before its first run (preflight.check) is refused here too."""
    from batchtune.measure import preflight

    preflight.check(cfg)
    return study_for(cfg).preview(cfg, time_steps)


def probe(cfg: Recipe, progress: ProbeEvents | None = None) -> ProbeOutcome:
    """Run (or resume) the probe of the kind ``cfg`` names; a grid's learning curves are drawn after."""
    from batchtune.measure import preflight
    from batchtune.measure.probe import ProbeResult

    preflight.check(cfg)  # every study kind, before its first write (a branched probe too)
    result = study_for(cfg).probe(cfg, progress)
    if not isinstance(result, ProbeResult):  # branched and pre-training probes draw their own
        return result
    try:  # best effort: a finished probe in a read-only directory still gives its answer
        plot = _plot_probe(ResultsStore.of(cfg), result.efficiency)
    except OSError as exc:
        return dataclasses.replace(result, notes=(*result.notes, _plot_skipped("learning-curve", exc)))
    return dataclasses.replace(result, plot_path=plot)


def probe_ranked(cfg: Recipe, progress: ProbeEvents | None = None) -> ProbeResult | BranchedProbeResult:
    """`probe` of a kind that `recommend` ranks (tune): a pre-training grid is refused."""
    from batchtune.measure.pretrain_probe import PretrainProbeResult

    result = probe(cfg, progress)
    if isinstance(result, PretrainProbeResult):  # check_pretrain_ranking refuses it before it runs
        raise InputError("a pre-training grid is not ranked by time-to-target: run `batchtune probe`")
    return result


def _plot_skipped(what: str, exc: OSError) -> str:
    return f"{what} plot not written ({exc.strerror or exc}: {exc.filename or 'the plots directory'})"


def _plot_probe(store: ResultsStore, efficiency: Any, plots_dir: Path | None = None) -> Path | None:
    """The learning curves of the store's runs against the samples axis, into ``plots_dir``
    (default: the store's own)."""
    from batchtune.measure.probe import load_run_data
    from batchtune.report.plots import plot_learning_curves

    curves: dict[str, list[tuple[list[float], list[float]]]] = {}
    for run in load_run_data(store):
        if run.record.status in FAILED_STATUSES:  # reported in the table; would wreck the axes
            continue
        s, v = run.curve(efficiency.metric)
        curves.setdefault(run.record.candidate, []).append((s.tolist(), v.tolist()))
    order = [c for c in efficiency.candidates if c.label in curves]
    if not order:
        return None
    where = plots_dir or store.plots_dir
    where.mkdir(parents=True, exist_ok=True)
    return plot_learning_curves(  # legend: the batch N and the LR it ran at, then the label
        {f"N={c.batch_responses}, lr {c.lr:.3g} ({c.label})": curves[c.label] for c in order},
        efficiency.target,
        efficiency.metric,
        where / "learning_curves.png",
    )


# ---- report --------------------------------------------------------------------------------------


def report(results: str, out_dir: Path | None = None) -> tuple[Path, Path]:
    """`batchtune report`: report.html (self-contained) and report.md into ``out_dir`` (default: the
    results directory), from the results' recommendation, or its sample efficiency alone when no
    throughput source exists. Returns (html, markdown) paths. With ``out_dir`` elsewhere nothing is
    written into the results directory: the time-to-target plot goes to ``out_dir``/plots."""
    from batchtune.errors import NotRanked, ThroughputMissing
    from batchtune.report.html import build_sections, to_html, to_markdown

    store = ResultsStore(results)
    if not store.exists():
        raise InputError(f"no results in {results}: run `batchtune probe` (or import-logs) first")
    out = Path(out_dir) if out_dir is not None else store.root
    elsewhere = out.resolve() != store.root.resolve()  # the results are evidence: leave them as they are
    try:
        rec, _, _ = recommend_from_args(results=results, plot=not elsewhere, command="report")
        eff, missing = rec.efficiency, ""
    except (ThroughputMissing, NotRanked) as exc:  # the curves and the efficiency still tell
        rec, eff, missing = None, exc.efficiency, str(exc)
    pngs = sorted(store.plots_dir.glob("*.png"), key=lambda p: p.stat().st_mtime)
    throughput = [p for p in pngs if p.name.startswith("throughput-")][-1:]  # the latest profile
    plots = [p for p in pngs if p.name in ("time_to_target.png", "learning_curves.png")] + throughput
    out.mkdir(parents=True, exist_ok=True)
    if elsewhere and rec is not None:  # the report's own time plot, beside it
        plots = [p for p in plots if p.name != "time_to_target.png"]
        with contextlib.suppress(OSError):  # best effort, as the probe's plot
            plots.insert(0, _plot_time(out / "plots", rec))
    if store.runs():  # redrawn from the runs there now (imported ones: no probe drew them)
        plots = [p for p in plots if p.name != "learning_curves.png"]
        with contextlib.suppress(OSError):  # best effort, as the probe's plot
            curves = _plot_probe(store, eff, out / "plots" if elsewhere else None)
            if curves is not None:
                plots.insert(0, curves)
    sections = build_sections(eff, rec, plots, missing)
    title = f"batchtune report: {Path(results).name}"
    from batchtune.measure.branched import branched_store

    runs = len(store.runs()) + len(branched_store(store.root).runs())  # a branched probe's too
    subtitle = f"results {store.root}; {runs} runs; target {eff.metric}"
    html_path, md_path = out / "report.html", out / "report.md"
    atomic_write_text(html_path, to_html(title, subtitle, sections))
    atomic_write_text(md_path, to_markdown(title, subtitle, sections, out))
    return html_path, md_path


# ---- profile-gen ---------------------------------------------------------------------------------


def profile(
    cfg: Recipe, progress: SweepProgress | None = None, *, roofline_only: bool = False
) -> tuple[ProfileResult | RooflinePrediction, list[Path]]:
    """Profile this machine (or, ``roofline_only``, predict from the roofline); returns the result
    and the plots written."""
    from batchtune.measure.profile import predict_roofline, run_profile
    from batchtune.report.plots import plot_profile, plot_roofline

    store = ResultsStore.of(cfg)
    if roofline_only:
        hw = None if cfg.hardware.name == "auto" else cfg.hardware.name
        pred = predict_roofline(cfg, hw)
        store.plots_dir.mkdir(parents=True, exist_ok=True)
        return pred, [plot_roofline(pred, store.plots_dir / "roofline.png")]
    result = run_profile(cfg, store, progress)
    return result, list(plot_profile(result, store.plots_dir))


# ---- recommend -----------------------------------------------------------------------------------


def _recipe_for_results(recipe: str | None, overrides: list[str], results: str | None) -> Recipe:
    """The recipe named, else the one stored with the results, else the default recipe."""
    if recipe is None and results is not None:
        manifest = ResultsStore(results).read_manifest()
        if manifest is not None and not isinstance(manifest.get("recipe"), dict):
            raise InputError(f"{results}/manifest.json has no recipe table; name one: recommend RECIPE")
        if manifest:
            data = apply_overrides(manifest["recipe"], overrides)
            return recipe_from_dict(data, f"{results}/manifest.json").with_results_dir(results)
    cfg = load_recipe(recipe or DEFAULT_RECIPE, overrides).with_results_dir(results)
    return _results_is_a_folder(cfg)


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
        if run.source == "probe":
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
    from batchtune.measure.plan import plan_candidates
    from batchtune.measure.probe import analyse_store

    check_pretrain_ranking(cfg, command, emit)
    store = ResultsStore.of(cfg)
    if not store.exists():
        raise InputError(
            f"no results in {store.root}: run `batchtune probe` first (or name another results directory)"
        )
    if cfg.study.branched:
        from batchtune.measure.branched import run_branched_probe

        branched = run_branched_probe(cfg, read_only=True)
        eff = branched.efficiency
    else:
        branched = None
        plan = plan_candidates(cfg)
        labels = {r.candidate for r in store.runs()}
        use_plan = labels <= set(plan.by_label()) and plan.reference in labels
        eff = analyse_store(store, cfg, plan if use_plan else None)
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
        joint = None
        if has_async_knobs(cfg):  # only then: the sync path never reaches the async machinery
            from batchtune.workflow.joint import joint_for, with_pick

            joint, thr = joint_for(cfg, store, eff, thr)
        try:
            rec = recommend(eff, thr)
        except AnalysisError as exc:
            from batchtune.measure.advice import why_not_ranked

            raise NotRanked(why_not_ranked(str(exc), store, cfg, eff), eff) from None
        rec = rec if joint is None else with_pick(rec, joint, cfg)
    else:  # what the search left unmeasured, and a batch schedule from the critical batch's progress
        from batchtune.analysis.branched.summary import with_schedule
        from batchtune.measure.branched import thin_evidence, unmeasured

        rec = recommend(eff, thr, unmeasured=unmeasured(branched), caveats=thin_evidence(branched))
        rec = with_schedule(rec, branched.summary, cfg.target.tolerance)
    if plot:
        try:  # best effort, as the probe's plot
            note = f"time-to-target plot: {_plot_time(store.plots_dir, rec)}"
        except OSError as exc:
            note = _plot_skipped("time-to-target", exc)
        rec = dataclasses.replace(rec, notes=(*rec.notes, note))
    return (rec, *_emit(rec, emit, gpus, cfg, gpus_per_node))


def _plot_time(plots_dir: Path, rec: Recommendation) -> Path:
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
        from batchtune.measurements import (
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
    cfg = _recipe_for_results(recipe, list(overrides or []), results)
    return recommend_for_recipe(cfg, throughput, emit, gpus, gpus_per_node, plot=plot, command=command)


def _emit(
    rec: Recommendation, trainer: str | None, gpus: int, cfg: Recipe | None, gpus_per_node: int
) -> tuple[str | None, Any]:
    if trainer is None:
        return None, None
    if cfg is not None and cfg.study.pretrain:
        return emit_pretrain_pick(rec, trainer, gpus, cfg), {}
    from batchtune.integrations.emit import emit_for_recommendation

    out = emit_for_recommendation(rec, trainer, gpus, cfg, gpus_per_node=gpus_per_node)
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
        return out.text + f"# {caveat}\n", out.values
    return out.text, out.values


def write_emitted(trainer: str, text: str, values: dict[str, object], out: Path) -> Path:
    """``--emit TRAINER --out FILE``: the emitted config as a file the trainer takes as it is."""
    from batchtune.integrations.emit_files import write_trainer_file

    return write_trainer_file(trainer, values, text, out)
