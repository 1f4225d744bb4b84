"""Commands that read results: recommend, report, check, import-logs, pretrain."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from batchtune.cli.app import (
    GpusPerNodeOpt,
    JsonOpt,
    OutOpt,
    RecipeArg,
    ResultsOpt,
    SetOpt,
    _check_out,
    _print_json,
    _show_efficiency_only,
    _show_recommendation,
    app,
    as_input_error,
    console,
    handle_errors,
)
from batchtune.errors import BatchtuneError
from batchtune.integrations.emit_base import DEFAULT_GPUS_PER_NODE
from batchtune.records.files import atomic_write_text

if TYPE_CHECKING:
    from batchtune.workflow.imports import ImportOutcome


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
        str | None,
        typer.Option(
            help="Print the winner as trainer config: verl | trl | openrlhf; for a pre-training recipe "
            "megatron | nanogpt | hf | torchtitan."
        ),
    ] = None,
    gpus: Annotated[
        int, typer.Option(min=1, help="GPUs the trainer runs on (--emit checks; an async split).")
    ] = DEFAULT_GPUS_PER_NODE,
    gpus_per_node: GpusPerNodeOpt = DEFAULT_GPUS_PER_NODE,
    out: OutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Rank every candidate by predicted time-to-target and print the winner, the reasons, and the config.

    Reads a results directory (probe runs, imported logs, a generation profile) or a measurements file
    (`--measurements`, see docs/formats.md). T(B) = R(B) / Θ(B), normalised to the reference batch.
    """
    from batchtune.errors import ThroughputMissing
    from batchtune.workflow.recommend import recommend_from_args

    _check_out(emit, out)
    try:
        rec, emitted, emitted_values = recommend_from_args(
            recipe,
            overrides=set_ or [],
            results=results,
            measurements=measurements,
            throughput=throughput,
            emit=emit,
            gpus=gpus,
            gpus_per_node=gpus_per_node,
        )
    except ThroughputMissing as missing:  # logs without timings: the critical batch still stands
        _show_efficiency_only(missing, json_out)
        return
    _show_recommendation(rec, emitted, emitted_values, json_out, emit, out)


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
        typer.Option(
            help="Flag a batch predicted to reach the target more than 1+x times later than the pick "
            "(below the critical batch and without a prediction: giving up more than 1+x throughput)."
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Check a trainer config against a probe: batch vs the recommendation's time-to-target ranking
    and the critical batch, LR vs the rule, generation concurrency vs the knee (at most the batch),
    time-to-target vs a baseline.

    Exit codes: 0 pass (warnings included), 1 a check failed, 2 bad input, 3 not enough evidence.
    With $GITHUB_STEP_SUMMARY set, appends a Markdown summary there and prints ::error/::warning
    annotations on the config's lines. See docs/ci.md.
    """
    from batchtune.report import check as report
    from batchtune.workflow import ci as workflow_ci

    try:
        tc, result = workflow_ci.check(
            config,
            fmt=fmt,
            results=results,
            measurements=measurements,
            baseline=baseline,
            lr_rule=lr_rule,
            lr_tolerance=lr_tolerance,
            time_tolerance=time_tolerance,
            waste_tolerance=waste_tolerance,
        )
    except (BatchtuneError, UnicodeDecodeError, OSError) as exc:  # a CI gate must not leave an
        error = (  # earlier run's report in place: this one says why it could not run
            exc
            if isinstance(exc, BatchtuneError)
            else as_input_error(exc, [config, results, measurements, baseline])
        )
        if junit is not None:
            atomic_write_text(junit, report.junit_error_xml(str(config), error))
        if json_out:
            _print_json({"status": "error", "exit_code": error.exit_code, "error": str(error)})
        raise error from None
    if junit is not None:
        atomic_write_text(junit, report.junit_xml(tc, result))
    if report.write_step_summary(tc, result) is not None or os.environ.get("GITHUB_ACTIONS") == "true":
        for line in report.github_annotations(tc, result):
            sys.stdout.write(line + "\n")
    if json_out:
        _print_json(report.check_to_dict(tc, result))
    else:
        report.render_check(console, tc, result)
    raise typer.Exit(result.exit_code)


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
    staleness: Annotated[
        int, typer.Option(help="k the runs were launched with: rollouts up to k trainer steps old (async).")
    ] = 0,
    updates_per_batch: Annotated[
        int, typer.Option(help="Optimiser updates per rollout batch (mini-batches x epochs).")
    ] = 1,
    map_: Annotated[
        list[str] | None,
        typer.Option(
            "--map",
            metavar="NAME=KEY",
            help="NAME=KEY: which log key or column holds a batchtune field (repeatable).",
        ),
    ] = None,
    metric: Annotated[str | None, typer.Option(help="Target metric name (target.metric).")] = None,
    target: Annotated[float | None, typer.Option(help="Target value (target.value).")] = None,
    lower_is_better: Annotated[bool, typer.Option(help="The metric is a loss.")] = False,
    set_: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Import runs you already have (verl, TRL, OpenRLHF/TensorBoard, W&B CSV, generic CSV/JSONL).

    They are stored like probe runs, so `batchtune recommend --results DIR` analyses them the same way.
    Every file is read and checked before anything is written. See docs/import-logs.md.
    """
    from batchtune.integrations.common import RunInfo
    from batchtune.workflow.imports import import_logs

    info = RunInfo(
        prompts=prompts,
        group_size=group_size,
        lr=lr,
        seed=seed,
        run_id=run_id,
        samples_per_step=samples_per_step,
        staleness=staleness,
        updates_per_batch=updates_per_batch,
    )
    outcome = import_logs(
        paths,
        fmt,
        results,
        info,
        mapping=map_ or [],
        metric=metric,
        target=target,
        lower_is_better=lower_is_better,
        overrides=set_ or [],
    )
    if json_out:
        _print_json(
            {
                "results_dir": outcome.results_dir,
                "added": list(outcome.added),
                "skipped": list(outcome.skipped),
                "empty": list(outcome.empty),
                "diverged": [{"run_id": rid, "reason": why} for rid, why in outcome.diverged],
            },
        )
        return
    _show_import(outcome)


def _show_import(outcome: ImportOutcome) -> None:
    """import-logs in the terminal: what was skipped, what diverged, what was imported, what next."""
    for path in outcome.empty:
        console.print(f"[yellow]skipped[/] {path}: empty (no header, no rows)")
    for rid, why in outcome.diverged:  # as a probe's diverged run: no estimate, no bound on time
        console.print(
            f"[yellow]diverged[/] {escape(rid)}: {escape(why)}; stored as a diverged run, left out of the "
            "ranking and its bounds"
        )
    target, results = outcome.recipe.target, outcome.results_dir
    console.print(
        f"imported {len(outcome.added)} run(s) into {results}"
        + (f"; {len(outcome.skipped)} already there" if outcome.skipped else "")
        + f". Target: {target.metric} {'>=' if target.higher_is_better else '<='} {target.value}"
    )
    console.print(f"Next: batchtune recommend --results {results}")


@app.command()
@handle_errors
def pretrain(
    paths: Annotated[list[Path], typer.Argument(help="Per-step loss logs (CSV or JSONL).")],
    targets: Annotated[
        str | None,
        typer.Option(
            help="Target losses, comma-separated (default: four levels the runs reach).", show_default=False
        ),
    ] = None,
    base_lr: Annotated[
        float | None,
        typer.Option(help="LR tuned at the schedule's first batch (default: 3e-4).", show_default=False),
    ] = None,
    rule: Annotated[
        str | None,
        typer.Option(help="LR rule across stages: sqrt (default) | linear | none.", show_default=False),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            "-s",
            metavar="KEY=VALUE",
            help="pretrain.targets=[3.2,3.0], lr_scaling.rule=linear or optimizer.lr=3e-4 (repeatable).",
        ),
    ] = None,
    map_: Annotated[
        list[str] | None,
        typer.Option(
            "--map",
            metavar="NAME=COLUMN",
            help="NAME=COLUMN for run, batch_tokens, step, loss, seed (repeatable).",
        ),
    ] = None,
    emit: Annotated[
        str | None,
        typer.Option(help="Write the schedule for a trainer: megatron | nanogpt | hf | torchtitan."),
    ] = None,
    seq_len: Annotated[int, typer.Option(help="--emit: tokens per sequence.")] = 2048,
    total_tokens: Annotated[int, typer.Option(help="--emit: tokens at which the last stage ends.")] = 0,
    gpus: Annotated[int, typer.Option(min=1, help="--emit: data-parallel size (world size).")] = 1,
    micro_batch: Annotated[int, typer.Option(help="--emit: sequences per GPU per micro-batch.")] = 1,
    json_out: JsonOpt = False,
) -> None:
    """Pre-training: B_opt and B_min per target loss from your runs, and a token-keyed schedule.

    One run per batch size (in tokens) and seed; per target loss, the batch with the fewest tokens
    to it (B_opt, with its grid bracket, a checked fit and a paired-seed interval) and the bracket
    of B_min (the smallest batch that reaches it). See docs/pretraining.md.
    """
    from batchtune.report.pretrain_grid import render_grid
    from batchtune.workflow import pretrain as workflow_pretrain

    spec = None
    if emit is not None:
        spec = workflow_pretrain.ScheduleEmit(emit, seq_len, total_tokens, gpus, micro_batch)
    outcome = workflow_pretrain.pretrain(
        paths, targets, base_lr, rule, list(map_ or []), list(set_ or []), spec
    )
    if json_out:
        _print_json({"analysis": outcome.analysis, "emitted": outcome.emitted})
    else:
        render_grid(console, outcome.analysis.grid)
        for note in outcome.analysis.notes:
            console.print(f"[yellow]note:[/] {note}")
    if outcome.unreached is not None:
        from batchtune.errors import AnalysisError

        raise AnalysisError(outcome.unreached)
    if outcome.emitted is not None and not json_out:
        sys.stdout.write(outcome.emitted)
