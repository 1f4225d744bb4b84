"""One function per command: inputs in, a result object out, no printing.

`cli.py` parses and renders; this module wires the layers below it: measure (probe, profile),
analysis (sample efficiency, throughput, recommendation), integrations (imports, emitters) and the
report layer's plots (files, not terminal output).
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchtune.analysis.system.hardware import RooflinePrediction
from batchtune.analysis.system.profile import ProfileResult
from batchtune.errors import InputError
from batchtune.events import ProbeEvents, SweepProgress
from batchtune.recipe.schema import Recipe
from batchtune.records.files import atomic_write_text
from batchtune.records.store import ResultsStore
from batchtune.records.types import FAILED_STATUSES
from batchtune.workflow.loading import load, results_is_a_folder
from batchtune.workflow.recommend import plot_skipped, plot_time, recommend_from_args
from batchtune.workflow.study import Preview, ProbeOutcome, study_for

if TYPE_CHECKING:
    from batchtune.measure.branched import BranchedProbeResult
    from batchtune.measure.probe import ProbeResult


def recipe_for(recipe: str | None, overrides: list[str], results: str | None) -> Recipe:
    """The recipe named (or the default), with --set overrides and the results directory applied."""
    return results_is_a_folder(load(recipe, overrides, results))


def validate_recipe(recipe: str) -> Recipe:
    """Load ``recipe`` and run every check a probe would run before its first run (the backend's
    too: task, prompts file, reward import, command placeholders)."""
    from batchtune.measure import preflight

    cfg = load(recipe)
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
        return dataclasses.replace(result, notes=(*result.notes, plot_skipped("learning-curve", exc)))
    return dataclasses.replace(result, plot_path=plot)


def probe_ranked(cfg: Recipe, progress: ProbeEvents | None = None) -> ProbeResult | BranchedProbeResult:
    """`probe` of a kind that `recommend` ranks (tune): a pre-training grid is refused."""
    from batchtune.measure.pretrain_probe import PretrainProbeResult

    result = probe(cfg, progress)
    if isinstance(result, PretrainProbeResult):  # check_pretrain_ranking refuses it before it runs
        raise InputError("a pre-training grid is not ranked by time-to-target: run `batchtune probe`")
    return result


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
            plots.insert(0, plot_time(out / "plots", rec))
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
