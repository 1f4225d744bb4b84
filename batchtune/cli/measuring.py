"""Commands that measure: probe, plan (a cost preview), profile-gen, tune, smoke."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from batchtune.cli.app import (
    GpusPerNodeOpt,
    JsonOpt,
    OutOpt,
    RecipeArg,
    ResultsOpt,
    SetOpt,
    WorkersOpt,
    _check_out,
    _print_json,
    _recipe,
    _show_recommendation,
    app,
    console,
    handle_errors,
)
from batchtune.cli.shown import (
    TuneScreen,
    branched_json,
    exit_if_not_estimated,
    not_estimated,
    plot_lines,
    probe_notes,
    refinement_json,
    say_choice,
    show_profile,
)
from batchtune.errors import InputError
from batchtune.integrations.emit_base import DEFAULT_GPUS_PER_NODE

if TYPE_CHECKING:
    pass

SmokeOpt = Annotated[
    bool,
    typer.Option(
        "--smoke", help="Run `batchtune smoke` instead: the whole pipeline at its smallest sizes, seconds."
    ),
]


DryRunOpt = Annotated[
    bool,
    typer.Option("--dry-run", help="Print the probe's plan and its predicted cost (as `plan`); run nothing."),
]


@app.command()
@handle_errors
def probe(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    results: ResultsOpt = None,
    workers: WorkersOpt = None,
    dry_run: DryRunOpt = False,
    smoke_: SmokeOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Short LR-scaled training runs at each candidate batch; find the critical training batch.

    Runs the reference (smallest) batch first, then the rest, stopping each run at the target, at its
    sample budget, or as soon as it is clearly slower than the reference. Interrupted? Rerun the same
    command: finished runs are kept and not redone.
    """
    if smoke_:
        if dry_run:
            raise InputError("--smoke and --dry-run: choose one")
        _smoke(recipe, set_, results, json_out)
    cfg = _recipe_with(recipe, set_, results, "run.workers", workers)
    if dry_run:
        _show_plan(cfg, None, json_out, _command_line("probe", recipe, set_, results, workers))
        return
    from batchtune import workflow
    from batchtune.measure.pretrain_probe import PretrainProbeResult
    from batchtune.report.progress import probe_progress
    from batchtune.report.terminal import render_efficiency, render_probe_cost

    say_choice(cfg, json_out)
    with probe_progress(console, enabled=not json_out) as progress:
        result = workflow.probe(cfg, progress)
    if isinstance(result, PretrainProbeResult):  # a grid of token batches -> B_opt, B_min per target loss
        from batchtune.report.pretrain_grid import render_pretrain_grid

        _print_json(result) if json_out else render_pretrain_grid(console, result)
        exit_if_not_estimated(result.analysis.unreached())
        return
    if json_out:
        from batchtune.report.json import efficiency_to_dict

        eff = efficiency_to_dict(result.efficiency)
        notes = [*eff.pop("notes", []), *probe_notes(result)]  # + a plot that was not written
        _print_json(
            {
                "results_dir": str(cfg.run.results_dir),
                "runs_done": result.runs_done,
                "runs_reused": result.runs_skipped,
                "wall_s": result.wall_s,
                "plot": str(result.plot_path) if result.plot_path else None,
                "probe_choice": cfg.probe_choice,
                **eff,
                "notes": notes,
                **branched_json(result),
                **refinement_json(result),
            }
        )
        exit_if_not_estimated(not_estimated(result.efficiency))
        return
    console.print(
        f"{result.runs_done} run(s) done, {result.runs_skipped} reused from {cfg.run.results_dir} "
        f"in {result.wall_s:.0f} s"
    )
    render_efficiency(console, result.efficiency)
    render_probe_cost(console, result.efficiency, None, simulated=cfg.backend.training == "nqm")
    from batchtune.measure.branched import BranchedProbeResult

    if isinstance(result, BranchedProbeResult):
        from batchtune.report.branched import render_branched

        render_branched(console, result.summary)
    plot_lines(result)
    exit_if_not_estimated(not_estimated(result.efficiency))


def _recipe_with(
    recipe: str | None, set_: list[str] | None, results: str | None, key: str, value: object
) -> Any:
    """The recipe with the user's ``--set`` overrides, then ``key=value`` where an option gave it."""
    overrides = list(set_ or []) + ([f"{key}={value}"] if value else [])
    return _recipe(recipe, overrides, results)


@app.command()
@handle_errors
def plan(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    results: ResultsOpt = None,
    workers: WorkersOpt = None,
    time_steps: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Training steps to time per candidate, alone (default: 3; 0 for the command backend).",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """What `probe` would run and cost, before spending it: candidates, seeds, samples and steps per run,
    wall time predicted from a few steps of each candidate timed here, and the cost against one run.

    For probe.mode = branched: the trunk and its checkpoints, each batch's window and longest branch,
    and upper bounds on samples and wall time (the search stops most runs well before them).
    """
    cfg = _recipe_with(recipe, set_, results, "run.workers", workers)
    _show_plan(cfg, time_steps, json_out, _command_line("probe", recipe, set_, results, workers))


def _command_line(
    command: str,
    recipe: str | None,
    set_: list[str] | None,
    results: str | None,
    workers: int | None,
    *extra: str,
) -> str:
    """The command that runs what a plan shows, with the user's recipe and options, quoted for a shell."""
    import shlex

    args = ["batchtune", command] + ([recipe] if recipe else [])
    for s in set_ or []:
        args += ["--set", s]
    args += (["--results", results] if results else []) + (["--workers", str(workers)] if workers else [])
    return shlex.join([*args, *extra])


def _show_plan(cfg: Any, time_steps: int | None, json_out: bool, run_it: str) -> None:
    from batchtune import workflow
    from batchtune.report.plan import plan_to_dict, render_plan

    preview = workflow.plan_preview(cfg, time_steps)
    if json_out:
        _print_json({**plan_to_dict(preview), "probe_choice": cfg.probe_choice, "run_it": run_it})
    else:
        render_plan(console, preview, run_it, cfg.probe_choice)


@app.command("profile-gen")
@handle_errors
def profile_gen(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    results: ResultsOpt = None,
    hardware: Annotated[
        str | None, typer.Option(help="Known GPU for the roofline (H200, H100-SXM, ...); default: detect.")
    ] = None,
    roofline_only: Annotated[
        bool, typer.Option("--roofline-only", help="Predict from the roofline alone; run no engine.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Measure generation throughput against concurrency and training time per step on this machine.

    Sweeps responses in flight over the recipe's grid (fixed-length and EOS modes), finds the critical
    generation batch (the knee: one more doubling buys less than the threshold), compares each point
    with the roofline bound, and times optimiser steps against batch. Out-of-memory points are recorded
    as the ceiling.
    """
    cfg = _recipe_with(recipe, set_, results, "hardware.name", hardware)
    _profile(cfg, json_out=json_out, roofline_only=roofline_only)


def _profile(cfg: Any, *, json_out: bool, roofline_only: bool = False) -> None:
    from batchtune import workflow
    from batchtune.report.progress import simple_progress

    with simple_progress(console, "profiling", enabled=not (json_out or roofline_only)) as progress:
        result, paths = workflow.profile(cfg, progress, roofline_only=roofline_only)
    if json_out:
        _print_json({**result.to_dict(), "plots": [str(p) for p in paths]})
        return
    show_profile(result, paths, roofline_only=roofline_only)


@app.command()
@handle_errors
def tune(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    results: ResultsOpt = None,
    emit: Annotated[
        str | None,
        typer.Option(
            help="Also print trainer config: verl|trl|openrlhf; pre-training: megatron|nanogpt|hf|torchtitan."
        ),
    ] = None,
    gpus: Annotated[
        int, typer.Option(min=1, help="GPUs for --emit divisibility checks.")
    ] = DEFAULT_GPUS_PER_NODE,
    gpus_per_node: GpusPerNodeOpt = DEFAULT_GPUS_PER_NODE,
    out: OutOpt = None,
    workers: WorkersOpt = None,
    dry_run: DryRunOpt = False,
    smoke_: SmokeOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Probe, profile and recommend in a row (the whole measurement on one recipe).

    With no recipe it runs the built-in default: a tiny Llama on a built-in task, on CPU, in minutes.
    """
    if smoke_:
        if dry_run:
            raise InputError("--smoke and --dry-run: choose one")
        _smoke(recipe, set_, results, json_out)
    _check_out(emit, out)
    cfg = _recipe_with(recipe, set_, results, "run.workers", workers)
    from batchtune.workflow.pretrain import check_pretrain_ranking
    from batchtune.workflow.study import study_for

    check_pretrain_ranking(cfg, "tune", emit)  # before a dry run too: its "Run it" would be refused
    if dry_run:  # the probe is the cost; profile-gen and recommend follow it
        extra: list[str] = ["--emit", emit, "--gpus", str(gpus)] if emit else []
        extra += ["--out", str(out)] if out else []
        if emit and gpus_per_node != DEFAULT_GPUS_PER_NODE:
            extra += ["--gpus-per-node", str(gpus_per_node)]
        _show_plan(cfg, None, json_out, _command_line("tune", recipe, set_, results, workers, *extra))
        if not json_out:
            then = (
                "Then recommend (ranks by the probe's own step times: pre-training generates nothing to "
                "profile; seconds)."
                if not study_for(cfg).profile_gen
                else "Then profile-gen (generation and training throughput on this machine) and recommend "
                "(reads both; seconds)."
            )
            console.print(then, highlight=False)
        return
    from batchtune.workflow.tune import tune as run_tune

    say_choice(cfg, json_out)
    tuned = run_tune(cfg, TuneScreen(json_out), emit=emit, gpus=gpus, gpus_per_node=gpus_per_node)
    rec, emitted, values = tuned.recommendation, tuned.emitted, tuned.emitted_values
    stated = tuned.stated_run
    _show_recommendation(rec, emitted, values, json_out, emit, out, efficiency_shown=True, stated_run=stated)


@app.command()
@handle_errors
def smoke(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    results: Annotated[
        str | None, typer.Option("--results", "-r", help="Keep the results here (default: a temporary dir).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """The whole pipeline on your recipe at its smallest sizes, in seconds: one seed, two batches, two
    steps, the tiniest model shape, a simulated engine where none is installed. Proves the recipe,
    task, reward, trainer command and log reader work before a real probe is paid for; prints what it
    checked and what it skipped. Exit 1 if a stage failed.
    """
    _smoke(recipe, set_, results, json_out)


def _smoke(recipe: str | None, set_: list[str] | None, results: str | None, json_out: bool) -> None:
    """The smoke command's body (also `probe --smoke`, `tune --smoke`); always exits."""
    from rich.markup import escape

    from batchtune.workflow import smoke as workflow_smoke

    result = workflow_smoke.smoke(recipe, list(set_ or []), results)
    if json_out:
        _print_json(result)
        raise typer.Exit(0 if result.ok else 1)
    console.print(f"smoke: {result.recipe} in {result.wall_s:.1f} s, results in {result.results_dir}")
    style = {"ok": "green", "failed": "bold red", "skipped": "yellow"}
    for st in result.stages:
        line = f"  [{style[st.status]}]{st.status:7}[/] {st.name:12} {escape(st.detail)}"
        console.print(line, highlight=False)
    sections = (
        ("not checked here:", result.unchecked),
        ("checked at smoke size only:", result.reduced),
    )
    for title, lines in sections:
        if lines:
            console.print(title, highlight=False)
            for text in lines:
                console.print(f"  - {escape(text)}", highlight=False)
    raise typer.Exit(0 if result.ok else 1)
