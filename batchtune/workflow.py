"""One function per command: inputs in, a result object out, no printing.

`cli.py` parses and renders; this module wires the layers below it: measure (probe, profile),
analysis (sample efficiency, throughput, recommendation), integrations (imports, emitters) and the
report layer's plots (files, not terminal output).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from batchtune.analysis.profile import ProfileResult, RooflinePrediction, analyse_throughput
from batchtune.analysis.recommend import (
    Recommendation,
    ThroughputModel,
    recommend,
    throughput_from_probe,
    throughput_from_profile,
)
from batchtune.errors import AnalysisError, InputError, ThroughputMissing
from batchtune.events import ProbeEvents, SweepProgress
from batchtune.integrations.emit_base import DEFAULT_GPUS_PER_NODE
from batchtune.recipe.load import DEFAULT_RECIPE, apply_overrides, load_recipe, recipe_from_dict
from batchtune.recipe.schema import Recipe
from batchtune.records import FAILED_STATUSES, ResultsStore


def recipe_for(recipe: str | None, overrides: list[str], results: str | None) -> Recipe:
    """The recipe named (or the default), with --set overrides and the results directory applied."""
    from batchtune.measure.probe import replace_results_dir

    return replace_results_dir(load_recipe(recipe or DEFAULT_RECIPE, overrides), results)


def validate_recipe(recipe: str) -> Recipe:
    """Load ``recipe`` and run every check a probe would run before its first run (the backend's
    too: task, prompts file, reward import, command placeholders)."""
    from batchtune.measure import preflight

    cfg = load_recipe(recipe)
    preflight.check(cfg)
    return cfg


# ---- plan / probe --------------------------------------------------------------------------------


def plan_preview(cfg: Recipe, time_steps: int | None = None) -> Any:
    """What the probe of ``cfg`` will cost, before running it; returns measure.preview.PlanPreview."""
    from batchtune.measure.preview import plan_preview as preview

    return preview(cfg, time_steps)


def probe(cfg: Recipe, progress: ProbeEvents | None = None) -> Any:
    """Run (or resume) the probe, then draw its learning curves; returns measure.probe.ProbeResult."""
    if cfg.probe.mode == "branched":  # one trunk + short branches: measure.branched.BranchedProbeResult
        from batchtune.measure.branched import run_branched_probe

        return run_branched_probe(cfg, progress)
    from batchtune.measure.probe import run_probe

    result = run_probe(cfg, progress=progress)
    return dataclasses.replace(
        result, plot_path=_plot_probe(ResultsStore(cfg.run.results_dir), result.efficiency)
    )


def _plot_probe(store: ResultsStore, efficiency: Any) -> Path | None:
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
    store.plots_dir.mkdir(parents=True, exist_ok=True)
    return plot_learning_curves(  # legend: the batch N and the LR it ran at, then the label
        {f"N={c.batch_responses}, lr {c.lr:.3g} ({c.label})": curves[c.label] for c in order},
        efficiency.target,
        efficiency.metric,
        store.plots_dir / "learning_curves.png",
    )


# ---- report --------------------------------------------------------------------------------------


def report(results: str, out_dir: Path | None = None) -> tuple[Path, Path]:
    """`batchtune report`: report.html (self-contained) and report.md into ``out_dir`` (default: the
    results directory), from the results' recommendation, or its sample efficiency alone when no
    throughput source exists. Returns (html, markdown) paths."""
    from batchtune.errors import ThroughputMissing
    from batchtune.records import atomic_write_text
    from batchtune.report.html import build_sections, to_html, to_markdown

    store = ResultsStore(results)
    if not store.exists():
        raise InputError(f"no results in {results}: run `batchtune probe` (or import-logs) first")
    try:
        rec, _, _ = recommend_from_args(None, [], results, None, "auto", None, 8)
        eff, missing = rec.efficiency, ""
    except ThroughputMissing as exc:
        rec, eff, missing = None, exc.efficiency, str(exc)
    pngs = sorted(store.plots_dir.glob("*.png"), key=lambda p: p.stat().st_mtime)
    throughput = [p for p in pngs if p.name.startswith("throughput-")][-1:]  # the latest profile
    plots = [p for p in pngs if p.name in ("time_to_target.png", "learning_curves.png")] + throughput
    sections = build_sections(eff, rec, plots, missing)
    title = f"batchtune report: {Path(results).name}"
    subtitle = f"results {store.root}; {len(store.runs())} runs; target {eff.metric}"
    out = Path(out_dir) if out_dir is not None else store.root
    out.mkdir(parents=True, exist_ok=True)
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

    store = ResultsStore(cfg.run.results_dir)
    if roofline_only:
        hw = None if cfg.hardware.name == "auto" else cfg.hardware.name
        pred = predict_roofline(cfg, hw)
        store.plots_dir.mkdir(parents=True, exist_ok=True)
        return pred, [plot_roofline(pred, store.plots_dir / "roofline.png")]
    result = run_profile(cfg, store, progress)
    return result, list(plot_profile(result, store.plots_dir))


# ---- pretrain ------------------------------------------------------------------------------------


def pretrain_probe(cfg: Recipe, progress: ProbeEvents | None = None) -> Any:
    """Run (or resume) the pre-training grid of a ``backend.training = "pretrain"`` recipe, analyse
    it and draw B_opt and B_min against the target loss; returns measure.pretrain_probe's result."""
    from batchtune.measure.pretrain_probe import run_pretrain_probe
    from batchtune.report.pretrain_grid import plot_bopt_bmin

    result = run_pretrain_probe(cfg, progress)
    plot = plot_bopt_bmin(result.analysis, ResultsStore(cfg.run.results_dir).plots_dir / "bopt_bmin.png")
    return dataclasses.replace(result, plot_path=plot)


def pretrain(paths: list[Path], targets: str, base_lr: float, rule: str, mapping: list[str]) -> Any:
    """Fit the pre-training curves of loss logs; returns analysis.pretraining's result."""
    from batchtune.analysis.pretraining import analyse, read_runs
    from batchtune.integrations.importing import parse_mapping

    try:
        levels = [float(t) for t in targets.split(",") if t.strip()]
    except ValueError:
        raise InputError(f"--targets {targets!r}: expected numbers separated by commas") from None
    return analyse(read_runs(paths, parse_mapping(mapping)), levels, base_lr=base_lr, rule=rule)


# ---- recommend -----------------------------------------------------------------------------------


def _recipe_for_results(recipe: str | None, overrides: list[str], results: str | None) -> Recipe:
    """The recipe named, else the one stored with the results, else the default recipe."""
    from batchtune.measure.probe import replace_results_dir

    if recipe is None and results is not None:
        manifest = ResultsStore(results).read_manifest()
        if manifest is not None and not isinstance(manifest.get("recipe"), dict):
            raise InputError(f"{results}/manifest.json has no recipe table; name one: recommend RECIPE")
        if manifest:
            data = apply_overrides(manifest["recipe"], overrides)
            return replace_results_dir(recipe_from_dict(data, f"{results}/manifest.json"), results)
    return replace_results_dir(load_recipe(recipe or DEFAULT_RECIPE, overrides), results)


def throughput_for(cfg: Recipe, store: ResultsStore, eff: Any, source: str) -> ThroughputModel:
    if source not in ("auto", "profile", "probe"):
        raise InputError(f"--throughput {source!r}: choose auto, profile or probe")
    other = cfg.generation.other_s_per_step
    if source in ("auto", "profile"):
        points = store.throughput()  # the latest profile of the directory, with its stored model shape
        profile = (
            analyse_throughput(points, cfg, model_info=store.model_info(points[-1].profile_id))
            if points
            else None
        )
        model = throughput_from_profile(profile, eff.candidates, other)
        if model is not None:
            where = points[-1].hardware or "this machine"
            return dataclasses.replace(model, source=f"profile-gen on {where}, timed alone")
        if source == "profile":
            raise InputError(
                f"{store.root} has no generation and training profile; run `batchtune profile-gen` first"
            )
    parallel: dict[str, int] = {}
    for run in store.runs():  # the most runs that shared the machine with any run of a candidate
        parallel[run.candidate] = max(parallel.get(run.candidate, 0), run.parallel_runs)
    return throughput_from_probe(eff.candidates, other, parallel)


def recommend_for_recipe(
    cfg: Recipe, throughput: str, emit: str | None, gpus: int, gpus_per_node: int = DEFAULT_GPUS_PER_NODE
) -> tuple[Recommendation, str | None, Any]:
    from batchtune.measure.plan import plan_candidates
    from batchtune.measure.probe import analyse_store

    store = ResultsStore(cfg.run.results_dir)
    if not store.exists():
        raise InputError(f"no results in {store.root}: run `batchtune probe` first, or pass --results")
    if cfg.probe.mode == "branched":
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
        thr = throughput_for(cfg, store, eff, throughput)
    except AnalysisError as exc:  # the critical batch needs no throughput: keep it, say what would rank
        raise ThroughputMissing(
            f"no time-to-target ranking: {exc}. The ranking needs a throughput source: "
            "`batchtune profile-gen` on the training hardware, timing columns in the imported logs "
            "(--map gen_s=KEY --map train_s=KEY), or --throughput probe after a probe that timed its steps",
            eff,
        ) from None
    rec = recommend(eff, thr)
    if branched is not None:  # the critical batch against progress gives a batch schedule
        from batchtune.analysis.branched_summary import with_schedule

        rec = with_schedule(rec, branched.summary, cfg.target.tolerance)
    rec = dataclasses.replace(rec, notes=(*rec.notes, f"time-to-target plot: {_plot_time(store, rec)}"))
    return (rec, *_emit(rec, emit, gpus, cfg, gpus_per_node))


def _plot_time(store: ResultsStore, rec: Recommendation) -> Path:
    from batchtune.report.plots_time import TIME_PLOT, plot_time_to_target

    return plot_time_to_target(rec, store.plots_dir / TIME_PLOT)


def recommend_from_args(
    recipe: str | None,
    overrides: list[str],
    results: str | None,
    measurements: Path | None,
    throughput: str,
    emit: str | None,
    gpus: int,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
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
    cfg = _recipe_for_results(recipe, overrides, results)
    return recommend_for_recipe(cfg, throughput, emit, gpus, gpus_per_node)


def _emit(
    rec: Recommendation, trainer: str | None, gpus: int, cfg: Recipe | None, gpus_per_node: int
) -> tuple[str | None, Any]:
    if trainer is None:
        return None, None
    from batchtune.integrations.emit import emit_for_recommendation

    out = emit_for_recommendation(rec, trainer, gpus, cfg, gpus_per_node=gpus_per_node)
    from batchtune.integrations.emit_schedule import schedule_appendix  # "" without a schedule

    appendix = schedule_appendix(trainer, rec, cfg, gpus, gpus_per_node=gpus_per_node)
    out = dataclasses.replace(out, text=out.text + appendix)
    concurrency = rec.winner_throughput.generation_concurrency
    if cfg is not None and concurrency and rec.throughput.source.startswith("profile"):
        from batchtune.analysis.roofline import KNOWN_HARDWARE
        from batchtune.integrations.emit_files import hardware_caveat

        points = ResultsStore(cfg.run.results_dir).throughput()
        where = points[-1].hardware if points else ""
        caveat = hardware_caveat(where, concurrency, tuple(KNOWN_HARDWARE))
        return out.text + f"# {caveat}\n", out.values
    return out.text, out.values


def write_emitted(trainer: str, text: str, values: dict[str, object], out: Path) -> Path:
    """``--emit TRAINER --out FILE``: the emitted config as a file the trainer takes as it is."""
    from batchtune.integrations.emit_files import write_trainer_file

    return write_trainer_file(trainer, values, text, out)


# ---- check ---------------------------------------------------------------------------------------

LR_RULES_CHECKABLE = ("sqrt", "linear", "none")


def check(
    config: Path,
    fmt: str,
    results: str | None,
    measurements: Path | None,
    baseline: Path | None,
    tolerances: Any = None,
    lr_rule: str = "auto",
) -> tuple[Any, Any]:
    """Check a trainer config against a probe's results; returns (TrainerConfig, CheckResult).

    Evidence that cannot support an estimate (AnalysisError) becomes an "insufficient" check, so the
    caller still writes its JUnit and summary, and exits 3."""
    from batchtune.analysis.check import (
        INSUFFICIENT,
        CheckItem,
        CheckResult,
        CheckTolerances,
        check_batch,
        check_concurrency,
        check_lr,
        check_time,
        interp_loglog,
    )
    from batchtune.errors import AnalysisError
    from batchtune.integrations.trainer_configs import read_trainer_config

    tol = tolerances or CheckTolerances()
    if (results is None) == (measurements is None):
        raise InputError("give the evidence: --results DIR (a probe's results) or --measurements FILE")
    if lr_rule not in ("auto", *LR_RULES_CHECKABLE):
        raise InputError(f"--lr-rule {lr_rule!r}: choose auto, {', '.join(LR_RULES_CHECKABLE)}")
    tc = read_trainer_config(config, fmt)
    base_value, base_unit = _read_baseline(baseline) if baseline is not None else (None, None)
    source = str(results or measurements)
    try:
        rec, _, _ = recommend_from_args(None, [], results, measurements, "auto", None, 8)
    except AnalysisError as exc:
        item = CheckItem(
            "evidence", INSUFFICIENT, "-", "-", f"not enough evidence in {source}: {exc}", "batch"
        )
        return tc, CheckResult((item,), None, "")
    eff, n = rec.efficiency, float(tc.batch_responses)
    ranked = {r.name: r for r in rec.ranking.candidates}
    main = sorted(
        (c for c in eff.candidates if c.family == "main" and c.label in ranked),
        key=lambda c: c.batch_responses,
    )
    batches = [float(c.batch_responses) for c in main]
    rps = [ranked[c.label].responses_per_s for c in main]
    unit = "s" if rec.throughput.absolute else "x reference"
    times = [
        ranked[c.label].time_to_target_s if rec.throughput.absolute else ranked[c.label].time_ratio
        for c in main
    ]
    ref = eff.get(eff.reference)
    notes = list(tc.notes)
    rule = lr_rule
    if rule == "auto":
        rule = ref.lr_rule if ref.lr_rule in LR_RULES_CHECKABLE else "sqrt"
        if ref.lr_rule not in LR_RULES_CHECKABLE:
            notes.append(f"the results record LR rule {ref.lr_rule!r}: the sqrt rule is assumed (--lr-rule)")
    predicted = interp_loglog(n, batches, times)
    why = (
        f"N = {n:g} is outside the measured batches {batches[0]:g}-{batches[-1]:g}"
        if batches and not batches[0] <= n <= batches[-1]
        else "a neighbouring batch never reached the target"
    )
    items = (
        check_batch(n, eff.critical, batches, rps, tol.waste),
        check_lr(tc.lr, n, ref.lr, float(ref.batch_responses), rule, tol.lr),
        check_concurrency(tc.generation_concurrency, rec.throughput.knee),
        check_time(predicted, unit, base_value, base_unit, tol.time, why),
    )
    return tc, CheckResult(items, predicted, unit, tuple(notes))


def _read_baseline(path: Path) -> tuple[float, str]:
    """The predicted time-to-target stored by an earlier `batchtune check --json`."""
    from batchtune import codec

    if not path.is_file():
        raise InputError(f"baseline {path} not found (write one with `batchtune check ... --json > {path}`)")
    data = codec.loads(path.read_text(), str(path))
    t = data.get("predicted_time_to_target") if isinstance(data, dict) else None
    if not isinstance(t, dict) or not isinstance(t.get("unit"), str):
        raise InputError(
            f"{path}: no predicted_time_to_target {{value, unit}}; is it `batchtune check --json` output?"
        )
    value = codec.as_float(t.get("value"), f"{path}: predicted_time_to_target.value")
    if not (value > 0):
        raise InputError(f"{path}: the baseline has no finite time-to-target ({t.get('value')!r})")
    return value, t["unit"]


# ---- smoke ---------------------------------------------------------------------------------------


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
    reduced: tuple[str, ...]  # what smoke mode shrank or skipped
    stages: tuple[SmokeStage, ...]
    wall_s: float

    @property
    def ok(self) -> bool:
        return all(s.status != "failed" for s in self.stages)


def smoke(recipe: str | None, overrides: list[str], results: str | None) -> SmokeResult:
    """Probe, profile and recommend on the recipe at its smallest sizes (recipe/smoke.py), in a
    temporary results directory unless ``results`` is given; a stage that fails is recorded and the
    later stages that need it are skipped. Analysis that the tiny budget cannot support (the target
    not reached) is a skip, not a failure: smoke proves the pipeline runs, not what it finds."""
    import shutil
    import tempfile
    import time

    from batchtune.errors import AnalysisError, BatchtuneError
    from batchtune.measure.probe import run_probe
    from batchtune.measure.profile import run_profile
    from batchtune.recipe.smoke import smoke_recipe

    t0 = time.perf_counter()
    tmp = None if results else tempfile.mkdtemp(prefix="batchtune-smoke-")
    cfg, reduced = smoke_recipe(load_recipe(recipe or DEFAULT_RECIPE, overrides), results or str(tmp))
    stages: list[SmokeStage] = []

    def stage(name: str, fn: Any) -> Any:
        t = time.perf_counter()
        try:
            detail, value = fn()
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
        probe = stage("probe", lambda: _smoke_probe(cfg, run_probe))
        stage("profile-gen", lambda: _smoke_profile(cfg, run_profile))
        if probe is None:
            stages.append(SmokeStage("recommend", "skipped", "the probe did not finish", 0.0))
        else:
            stage("recommend", lambda: _smoke_recommend(cfg))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    where = results or "a temporary directory (removed)"
    return SmokeResult(cfg.source, where, tuple(reduced), tuple(stages), time.perf_counter() - t0)


def _smoke_probe(cfg: Recipe, run_probe: Any) -> tuple[str, Any]:
    result = run_probe(cfg)
    eff = result.efficiency
    failed = [c.label for c in eff.candidates if c.status == "failed"]
    if failed:
        reasons = "; ".join(f for c in eff.candidates for f in c.failures)
        raise InputError(f"runs failed: {', '.join(failed)}: {reasons}")
    metrics = f"metric {eff.metric!r} logged" if all(c.estimate for c in eff.candidates) else "no metric"
    return f"{result.runs_done} run(s) of {', '.join(c.label for c in eff.candidates)}: {metrics}", result


def _smoke_profile(cfg: Recipe, run_profile: Any) -> tuple[str, Any]:
    result = run_profile(cfg, ResultsStore(cfg.run.results_dir), None)
    n = sum(len(m.points) for m in result.modes.values())
    return f"{n} generation point(s) on {cfg.generation.backend}, training step fit", result


def _smoke_recommend(cfg: Recipe) -> tuple[str, Any]:
    rec, _, _ = recommend_for_recipe(cfg, "auto", None, 8)
    return f"ranked {len(rec.ranking.candidates)} candidates (numbers meaningless at smoke size)", rec
