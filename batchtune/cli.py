"""The `batchtune` command line. Each command parses, calls one function, renders; errors become one
line on stderr and a non-zero exit here, and only here. Heavy modules are imported inside commands so
that `batchtune --help` starts without torch.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from batchtune import __version__
from batchtune.errors import BatchtuneError, Terminated
from batchtune.integrations.emit_base import DEFAULT_GPUS_PER_NODE

app = typer.Typer(
    name="batchtune",
    help=(
        "Find the batch size, learning rate and generation concurrency that reach your target "
        "quality soonest: time-to-target = samples-to-target / end-to-end throughput.\n\n"
        "Start with `batchtune tune` (the built-in tiny GRPO default, a few minutes on CPU), or "
        "`batchtune recommend --measurements FILE` on numbers you already have."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)
recipes_app = typer.Typer(help="List, show, copy and validate recipes.", no_args_is_help=True)
app.add_typer(recipes_app, name="recipes")


def _console(stderr: bool = False) -> Console:
    """Wide tables stay readable in logs and CI, where there is no terminal to measure."""
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=150)


console = _console()
err_console = Console(stderr=True, width=400)

RecipeArg = Annotated[
    str | None,
    typer.Argument(help="Recipe TOML file or shipped recipe name (default: tiny-grpo).", show_default=False),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a recipe value, e.g. --set optimizer.lr=3e-4 (repeatable)."),
]
ResultsOpt = Annotated[
    str | None,
    typer.Option("--results", "-r", help="Results directory (default: the recipe's run.results_dir)."),
]
GpusPerNodeOpt = Annotated[
    int, typer.Option(help="GPUs per node, for the node layout of --emit verl|openrlhf.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout instead.")]
OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        help="With --emit: write a file the trainer takes (verl overrides, TRL YAML, OpenRLHF script).",
        show_default=False,
    ),
]


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn expected failures into one line on stderr and an exit code; nothing else prints a trace."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BatchtuneError as exc:
            _error_line(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except UnicodeDecodeError as exc:  # a reader that did not name its file: name the inputs
            given = [*args, *kwargs.values()]
            given += [p for v in kwargs.values() if isinstance(v, list) for p in v]
            files = [str(v) for v in given if isinstance(v, Path)]
            _error_line(f"{', '.join(files) or 'an input file'} is not UTF-8 text (byte {exc.start})")
            raise typer.Exit(2) from None
        except OSError as exc:  # disk full, file-size limit, read-only or vanished files: the environment
            where = exc.filename or "a file"
            _error_line(f"{where}: {exc.strerror or exc}")
            raise typer.Exit(2) from None
        except Terminated as exc:
            err_console.print(f"{exc}: rerun the same command to resume; finished runs are kept")
            raise typer.Exit(128 + exc.signum) from None
        except KeyboardInterrupt:
            err_console.print("interrupted: rerun the same command to resume; finished runs are kept")
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except Exception as exc:  # a bug: still one line, the trace on request
            if os.environ.get("BATCHTUNE_DEBUG"):
                raise
            first = str(exc).splitlines()[0] if str(exc) else ""
            err_console.print(
                f"[red]internal error:[/] {type(exc).__name__}: {escape(first)} "
                "(a bug in batchtune: rerun with BATCHTUNE_DEBUG=1 for the traceback and report it)",
                highlight=False,
            )
            raise typer.Exit(70) from None

    return wrapper


def _error_line(message: str) -> None:
    """One line on stderr; brackets in the message are text, not rich markup."""
    text = " ".join(message.split("\n"))
    err_console.print(f"[red]error:[/] {escape(text)}", markup=True, highlight=False, soft_wrap=True)


def _recipe(recipe: str | None, overrides: list[str] | None, results: str | None) -> Any:
    from batchtune.workflow import recipe_for

    return recipe_for(recipe, overrides or [], results)


def _print_json(data: Any) -> None:
    from batchtune import codec

    sys.stdout.write(codec.dumps(data, indent=2) + "\n")


def version_callback(value: bool) -> None:
    if value:
        console.print(f"batchtune {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    pass


@app.command()
@handle_errors
def probe(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    results: ResultsOpt = None,
    workers: Annotated[int | None, typer.Option(help="Parallel local processes (run.workers).")] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the plan and its predicted cost (as `plan`); run nothing."),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Short LR-scaled training runs at each candidate batch; find the critical training batch.

    Runs the reference (smallest) batch first, then the rest, stopping each run at the target, at its
    sample budget, or as soon as it is clearly slower than the reference. Interrupted? Rerun the same
    command: finished runs are kept and not redone.
    """
    overrides = list(set_ or []) + ([f"run.workers={workers}"] if workers else [])
    cfg = _recipe(recipe, overrides, results)
    if dry_run:
        _show_plan(cfg, None, json_out)
        return
    from batchtune import workflow
    from batchtune.report.progress import probe_progress
    from batchtune.report.terminal import render_efficiency, render_probe_cost

    if cfg.backend.training == "pretrain":  # a grid of token batches -> B_opt, B_min per target loss
        from batchtune.report.pretrain_grid import render_pretrain_grid

        with probe_progress(console, enabled=not json_out) as progress:
            grid = workflow.pretrain_probe(cfg, progress)
        _print_json(grid) if json_out else render_pretrain_grid(console, grid)
        return

    with probe_progress(console, enabled=not json_out) as progress:
        result = workflow.probe(cfg, progress)
    if json_out:
        from batchtune.report.json import efficiency_to_dict

        _print_json(
            {
                "results_dir": str(cfg.run.results_dir),
                "runs_done": result.runs_done,
                "runs_reused": result.runs_skipped,
                "wall_s": result.wall_s,
                "plot": str(result.plot_path) if result.plot_path else None,
                **efficiency_to_dict(result.efficiency),
                **_branched_json(result),
            }
        )
        return
    console.print(
        f"{result.runs_done} run(s) done, {result.runs_skipped} reused from {cfg.run.results_dir} "
        f"in {result.wall_s:.0f} s"
    )
    render_efficiency(console, result.efficiency)
    render_probe_cost(console, result.efficiency, None)
    if getattr(result, "summary", None) is not None:  # probe.mode = branched
        from batchtune.report.branched import render_branched

        render_branched(console, result.summary)
    if result.plot_path:
        console.print(f"Learning curves: {result.plot_path}")


def _branched_json(result: Any) -> dict[str, Any]:
    if getattr(result, "summary", None) is None:
        return {}
    from batchtune.report.branched import branched_to_dict

    return {"branched": branched_to_dict(result.summary)}


@app.command()
@handle_errors
def plan(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    results: ResultsOpt = None,
    workers: Annotated[int | None, typer.Option(help="Parallel local processes (run.workers).")] = None,
    time_steps: Annotated[
        int | None,
        typer.Option(
            help="Training steps to time per candidate, alone (default: 3; 0 for the command backend).",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """What `probe` would run and cost, before spending it: candidates, seeds, samples and steps per run,
    wall time predicted from a few steps of each candidate timed here, and the cost against one run.
    """
    overrides = list(set_ or []) + ([f"run.workers={workers}"] if workers else [])
    _show_plan(_recipe(recipe, overrides, results), time_steps, json_out)


def _show_plan(cfg: Any, time_steps: int | None, json_out: bool) -> None:
    from batchtune import workflow
    from batchtune.report.plan import plan_to_dict, render_plan

    preview = workflow.plan_preview(cfg, time_steps)
    if json_out:
        _print_json(plan_to_dict(preview))
    else:
        render_plan(console, preview)


@app.command()
@handle_errors
def report(
    results: Annotated[str, typer.Argument(help="Results directory (a probe's, or imported logs).")],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Folder for report.html and report.md (default: RESULTS).", show_default=False
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Write one self-contained HTML report (plots embedded, tables, the recommendation and why, the
    probe's cost, caveats) and the same as Markdown for a pull request.
    """
    from batchtune import workflow

    html_path, md_path = workflow.report(results, out)
    if json_out:
        _print_json({"html": str(html_path), "markdown": str(md_path)})
        return
    console.print(f"wrote {html_path} (open it in a browser) and {md_path}", highlight=False)


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
    overrides = list(set_ or []) + ([f"hardware.name={hardware}"] if hardware else [])
    cfg = _recipe(recipe, overrides, results)
    _profile(cfg, json_out=json_out, roofline_only=roofline_only)


def _profile(cfg: Any, *, json_out: bool, roofline_only: bool = False, quiet_json: bool = False) -> Any:
    from batchtune import workflow
    from batchtune.report.profile import render_prediction, render_profile
    from batchtune.report.progress import simple_progress

    with simple_progress(console, "profiling", enabled=not (json_out or roofline_only)) as progress:
        result, paths = workflow.profile(cfg, progress, roofline_only=roofline_only)
    if json_out:
        if not quiet_json:
            _print_json({**result.to_dict(), "plots": [str(p) for p in paths]})
        return result
    (render_prediction if roofline_only else render_profile)(console, result)
    for p in paths:
        console.print(f"Plot: {p}")
    return result


@app.command()
@handle_errors
def recommend(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    results: ResultsOpt = None,
    measurements: Annotated[
        Path | None,
        typer.Option("--measurements", "-m", help="A measurements TOML file instead of a results dir."),
    ] = None,
    throughput: Annotated[
        str, typer.Option(help="Where Θ comes from: auto | profile | probe (auto: profile if any).")
    ] = "auto",
    emit: Annotated[
        str | None, typer.Option(help="Print the winner as trainer config: verl | trl | openrlhf.")
    ] = None,
    gpus: Annotated[int, typer.Option(help="GPUs the trainer runs on (for --emit divisibility checks).")] = 8,
    gpus_per_node: GpusPerNodeOpt = DEFAULT_GPUS_PER_NODE,
    out: OutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Rank every candidate by predicted time-to-target and print the winner, the reasons, and the config.

    Reads a results directory (probe runs, imported logs, a generation profile) or a measurements file
    (`--measurements`, see docs/formats.md). T(B) = R(B) / Θ(B), normalised to the reference batch.
    """
    from batchtune.errors import ThroughputMissing
    from batchtune.workflow import recommend_from_args

    _check_out(emit, out)
    try:
        rec, emitted, emitted_values = recommend_from_args(
            recipe, set_ or [], results, measurements, throughput, emit, gpus, gpus_per_node
        )
    except ThroughputMissing as missing:  # logs without timings: the critical batch still stands
        _show_efficiency_only(missing, json_out)
        return
    _show_recommendation(rec, emitted, emitted_values, json_out, emit, out)


def _check_out(emit: str | None, out: Path | None) -> None:
    if out is not None and emit is None:
        from batchtune.errors import InputError

        raise InputError("--out writes the --emit config: add --emit verl|trl|openrlhf")


def _show_efficiency_only(missing: Any, json_out: bool) -> None:
    from batchtune.report.json import efficiency_to_dict
    from batchtune.report.terminal import render_efficiency

    if json_out:
        _print_json(
            {
                "recommended": None,
                "throughput_missing": str(missing),
                **efficiency_to_dict(missing.efficiency),
            }
        )
        return
    render_efficiency(console, missing.efficiency)
    err_console.print(f"[yellow]note:[/] {escape(str(missing))}", highlight=False, soft_wrap=True)


def _show_recommendation(
    rec: Any,
    emitted: str | None,
    emitted_values: Any,
    json_out: bool,
    trainer: str | None = None,
    out: Path | None = None,
) -> None:
    written = None
    if out is not None and trainer is not None and emitted is not None:
        from batchtune.workflow import write_emitted

        written = write_emitted(trainer, emitted, emitted_values, out)
    if json_out:
        from batchtune.report.json import recommendation_to_dict

        data = recommendation_to_dict(rec)
        if rec.schedule is not None:
            from batchtune.report.schedule import schedule_to_dict

            data["batch_schedule"] = schedule_to_dict(rec.schedule)
        if emitted is not None:
            data["emitted"] = {"text": emitted, "values": emitted_values, "file": written}
        _print_json(data)
        return
    from batchtune.report.terminal import render_probe_cost, render_recommendation

    render_recommendation(console, rec, emitted)
    if rec.schedule is not None:
        from batchtune.report.schedule import render_schedule

        render_schedule(console, rec.schedule)
    if written is not None:
        console.print(f"Trainer config written to {written}", highlight=False)
    if rec.efficiency.total_samples:
        render_probe_cost(console, rec.efficiency, rec)


@app.command()
@handle_errors
def tune(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    results: ResultsOpt = None,
    emit: Annotated[str | None, typer.Option(help="Also print trainer config: verl|trl|openrlhf.")] = None,
    gpus: Annotated[int, typer.Option(help="GPUs for --emit divisibility checks.")] = 8,
    gpus_per_node: GpusPerNodeOpt = DEFAULT_GPUS_PER_NODE,
    out: OutOpt = None,
    workers: Annotated[int | None, typer.Option(help="Parallel local processes (run.workers).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Probe, profile and recommend in a row (the whole measurement on one recipe).

    With no recipe it runs the built-in default: a tiny Llama on a built-in task, on CPU, in minutes.
    """
    _check_out(emit, out)
    overrides = list(set_ or []) + ([f"run.workers={workers}"] if workers else [])
    cfg = _recipe(recipe, overrides, results)
    from batchtune import workflow
    from batchtune.report.progress import probe_progress
    from batchtune.report.terminal import render_efficiency

    if not json_out:
        console.rule("1/3 probe: sample efficiency")
    with probe_progress(console, enabled=not json_out) as progress:
        result = workflow.probe(cfg, progress)
    if not json_out:
        render_efficiency(console, result.efficiency)
        if result.plot_path:
            console.print(f"Learning curves: {result.plot_path}")
        console.rule("2/3 profile-gen: system efficiency")
    _profile(cfg, json_out=json_out, quiet_json=True)
    if not json_out:
        console.rule("3/3 recommend: time-to-target")
    rec, emitted, values = workflow.recommend_for_recipe(cfg, "auto", emit, gpus, gpus_per_node)
    _show_recommendation(rec, emitted, values, json_out, emit, out)


@app.command()
@handle_errors
def check(
    config: Annotated[
        Path, typer.Argument(help="The trainer config: verl YAML or overrides, TRL, OpenRLHF flags.")
    ],
    results: ResultsOpt = None,
    measurements: Annotated[
        Path | None,
        typer.Option("--measurements", "-m", help="A measurements TOML file instead of --results."),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="auto | verl | trl | openrlhf | generic.")
    ] = "auto",
    baseline: Annotated[
        Path | None, typer.Option(help="An earlier `check --json` output: fail if time-to-target regresses.")
    ] = None,
    junit: Annotated[Path | None, typer.Option(help="Also write the checks as JUnit XML here.")] = None,
    lr_rule: Annotated[
        str, typer.Option(help="LR rule to check against: auto (the results' own) | sqrt | linear | none.")
    ] = "auto",
    lr_tolerance: Annotated[
        float | None, typer.Option(help="Fail when lr/rule leaves [1/(1+x), 1+x].")
    ] = None,
    time_tolerance: Annotated[float | None, typer.Option(help="Fail when T/T_baseline > 1+x.")] = None,
    waste_tolerance: Annotated[
        float | None,
        typer.Option(help="Warn below the critical batch when it gives up more than 1+x throughput."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Check a trainer config against a probe: batch vs the critical batch, LR vs the rule, generation
    concurrency vs the knee, time-to-target vs a baseline.

    Exit codes: 0 pass (warnings included), 1 a check failed, 2 bad input, 3 not enough evidence.
    With $GITHUB_STEP_SUMMARY set, appends a Markdown summary there and prints ::error/::warning
    annotations on the config's lines. See docs/ci.md.
    """
    import dataclasses as dc

    from batchtune import workflow
    from batchtune.analysis.check import CheckTolerances
    from batchtune.report import check as report

    given = {"lr": lr_tolerance, "time": time_tolerance, "waste": waste_tolerance}
    tol = dc.replace(CheckTolerances(), **{k: v for k, v in given.items() if v is not None})
    tc, result = workflow.check(config, fmt, results, measurements, baseline, tol, lr_rule)
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(report.junit_xml(tc, result))
    if report.write_step_summary(tc, result) is not None or os.environ.get("GITHUB_ACTIONS") == "true":
        for line in report.github_annotations(tc, result):
            sys.stdout.write(line + "\n")
    if json_out:
        _print_json(report.check_to_dict(tc, result))
    else:
        report.render_check(console, tc, result)
    raise typer.Exit(result.exit_code)


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
    from batchtune import workflow

    result = workflow.smoke(recipe, list(set_ or []), results)
    if json_out:
        _print_json(result)
    else:
        console.print(f"smoke: {result.recipe} in {result.wall_s:.1f} s, results in {result.results_dir}")
        style = {"ok": "green", "failed": "bold red", "skipped": "yellow"}
        for st in result.stages:
            console.print(f"  [{style[st.status]}]{st.status:7}[/] {st.name:12} {st.detail}", highlight=False)
        console.print("reduced for smoke (not checked at full size):", highlight=False)
        for line in result.reduced:
            console.print(f"  - {line}", highlight=False)
    raise typer.Exit(0 if result.ok else 1)


@app.command("import-logs")
@handle_errors
def import_logs_cmd(
    paths: Annotated[list[Path], typer.Argument(help="Log files or folders (one run each, or several).")],
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="jsonl | csv | verl | trl | tensorboard | wandb.")
    ] = "jsonl",
    results: Annotated[str, typer.Option("--results", "-r", help="Results directory to add the runs to.")] = (
        "bt-results/imported"
    ),
    prompts: Annotated[int, typer.Option(help="P of these runs, if the log does not say.")] = 0,
    group_size: Annotated[int, typer.Option(help="G of these runs, if the log does not say.")] = 0,
    lr: Annotated[float, typer.Option(help="LR of these runs, if the log does not say.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of these runs.")] = 0,
    run_id: Annotated[str, typer.Option(help="Run id (default: from the file name).")] = "",
    samples_per_step: Annotated[
        int, typer.Option(help="Responses per logged step when it is not P*G (e.g. TRL's optimiser steps).")
    ] = 0,
    map_: Annotated[
        list[str] | None,
        typer.Option("--map", help="NAME=KEY: which log key or column holds a batchtune field (repeatable)."),
    ] = None,
    metric: Annotated[str | None, typer.Option(help="Target metric name (target.metric).")] = None,
    target: Annotated[float | None, typer.Option(help="Target value (target.value).")] = None,
    lower_is_better: Annotated[bool, typer.Option(help="The metric is a loss.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Import runs you already have (verl, TRL, OpenRLHF/TensorBoard, W&B CSV, generic CSV/JSONL).

    They are stored like probe runs, so `batchtune recommend --results DIR` analyses them the same way.
    Every file is read and checked before anything is written. See docs/import-logs.md.
    """
    from batchtune.integrations.common import RunInfo
    from batchtune.integrations.importing import import_logs, parse_mapping

    info = RunInfo(
        prompts=prompts,
        group_size=group_size,
        lr=lr,
        seed=seed,
        run_id=run_id,
        samples_per_step=samples_per_step,
    )
    overrides = []
    if metric is not None:
        overrides.append(f"target.metric={json.dumps(metric)}")  # a JSON string is a TOML string
    if target is not None:
        overrides.append(f"target.value={target}")
    if lower_is_better:
        overrides.append("target.higher_is_better=false")
    result, cfg = import_logs(paths, fmt, results, info, parse_mapping(map_ or []), overrides)
    if json_out:
        _print_json({"results_dir": results, "added": list(result.added), "skipped": list(result.skipped)})
        return
    console.print(
        f"imported {len(result.added)} run(s) into {results}"
        + (f"; {len(result.skipped)} already there" if result.skipped else "")
        + f". Target: {cfg.target.metric} {'>=' if cfg.target.higher_is_better else '<='} {cfg.target.value}"
    )
    console.print(f"Next: batchtune recommend --results {results}")


@app.command()
@handle_errors
def pretrain(
    paths: Annotated[list[Path], typer.Argument(help="Per-step loss logs (CSV or JSONL).")],
    targets: Annotated[
        str, typer.Option(help="Target losses, comma-separated (default: three levels the runs reach).")
    ] = "",
    base_lr: Annotated[float, typer.Option(help="LR tuned at the schedule's first batch.")] = 3e-4,
    rule: Annotated[str, typer.Option(help="LR rule across stages: sqrt | linear | none.")] = "sqrt",
    map_: Annotated[
        list[str] | None,
        typer.Option("--map", help="NAME=COLUMN for run, batch_tokens, step, loss (repeatable)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Pre-training: critical batch per target loss, B_opt/B_min (WSD), and a token-keyed schedule.

    Each run (one batch size, in tokens) gives the steps and tokens it took to first reach each target
    loss; the McCandlish hyperbola gives S_min, E_min and B_crit, the three-stage WSD fit of E(S) gives
    B_opt and B_min. See docs/pretraining.md.
    """
    from batchtune import workflow
    from batchtune.report.terminal import render_pretrain

    result = workflow.pretrain(paths, targets, base_lr, rule, list(map_ or []))
    if json_out:
        _print_json(result)
        return
    render_pretrain(console, result)


@recipes_app.command("list")
@handle_errors
def recipes_list(json_out: JsonOpt = False) -> None:
    """The recipes that ship with batchtune, with the first line of each header."""
    from rich.table import Table

    from batchtune.recipe.load import shipped_recipes

    rows = [
        (
            name,
            str(path),
            next((ln.lstrip("# ").strip() for ln in path.read_text().splitlines() if ln.startswith("#")), ""),
        )
        for name, path in sorted(shipped_recipes().items())
    ]
    if json_out:
        _print_json([{"name": n, "path": p, "summary": s} for n, p, s in rows])
        return
    table = Table(title="Shipped recipes (use the name or a path)")
    table.add_column("name")
    table.add_column("what it is for")
    for name, _, first in rows:
        table.add_row(name, first)
    console.print(table)


@recipes_app.command("show")
@handle_errors
def recipes_show(recipe: RecipeArg = None, set_: SetOpt = None) -> None:
    """Print a recipe with every default filled in (after --set overrides)."""
    from batchtune.recipe.load import DEFAULT_RECIPE, load_recipe, recipe_to_toml

    sys.stdout.write(recipe_to_toml(load_recipe(recipe or DEFAULT_RECIPE, set_ or [])))


@recipes_app.command("validate")
@handle_errors
def recipes_validate(recipe: Annotated[str, typer.Argument(help="Recipe file or name.")]) -> None:
    """Check a recipe: unknown keys, wrong types and bad values are reported together, and the checks a
    probe runs before its first run (task, prompts file, reward import, command placeholders)."""
    from batchtune.workflow import validate_recipe

    cfg = validate_recipe(recipe)
    console.print(f"[green]ok[/] {cfg.source}")


@recipes_app.command("cp")
@handle_errors
def recipes_cp(
    name: Annotated[str, typer.Argument(help="Shipped recipe name.")],
    dest: Annotated[Path, typer.Argument(help="Where to write the copy.")],
) -> None:
    """Copy a shipped recipe to edit it."""
    from batchtune.errors import InputError
    from batchtune.recipe.load import resolve_recipe_path

    src = resolve_recipe_path(name)
    if dest.is_dir():
        dest = dest / src.name
    if dest.exists():
        raise InputError(f"{dest} exists; choose another name")
    dest.write_text(src.read_text())
    console.print(f"wrote {dest}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
