"""The typer app, the options every command shares, and the one error funnel: every expected failure
becomes one line on stderr and an exit code here, and only here. Heavy modules are imported inside
commands so that `batchtune --help` starts without torch.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from batchtune import __version__
from batchtune.errors import BatchtuneError, InputError, Terminated

TyperCommand = typer.core.TyperCommand

_METAVARS = {"int": "INT", "float": "FLOAT", "str": "TEXT", "Path": "PATH", "path": "PATH"}


class _Command(TyperCommand):
    """Help that reads as written: docstring paragraphs joined into lines (the terminal wraps them,
    not the source's line breaks), flags without a ``<bool>``, and values named in capitals (``TEXT``,
    ``PATH``, ``KEY=VALUE``) instead of ``<list[str]>``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.help:
            text = inspect.cleandoc(self.help)
            self.help = "\n\n".join(" ".join(p.split("\n")) for p in text.split("\n\n"))

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        for param in params:
            if param.metavar is not None:
                continue
            if getattr(param, "is_flag", False):
                param.metavar = ""
            elif isinstance(param, typer.core.TyperArgument):  # its name says it: no "<list[Path]>"
                param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
            else:  # "<list[str]>" -> TEXT (repeatable options say so in their help)
                shown = param.display_type(ctx)  # type: ignore[attr-defined]
                label = shown.strip("<>").removeprefix("list[").removesuffix("]")
                param.metavar = _METAVARS.get(label, label.upper())
        return params


class _Typer(typer.Typer):
    """Every command gets the clean help above, whichever module declares it."""

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", _Command)
        return super().command(*args, **kwargs)


app = _Typer(
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
recipes_app = _Typer(help="List, show, copy and validate recipes.", no_args_is_help=True)
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
    typer.Option(
        "--set",
        "-s",
        metavar="KEY=VALUE",
        help="Override a recipe value, e.g. --set optimizer.lr=3e-4 (repeatable).",
    ),
]
ResultsOpt = Annotated[
    str | None,
    typer.Option("--results", "-r", help="Results directory (default: the recipe's run.results_dir)."),
]
GpusPerNodeOpt = Annotated[
    int, typer.Option(min=1, help="GPUs per node, for the node layout of --emit verl|openrlhf.")
]
WorkersOpt = Annotated[int | None, typer.Option(min=1, help="Parallel local processes (run.workers).")]
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


_OUTPUT_OPTIONS = frozenset({"junit", "out"})  # paths a command writes, never reads


def as_input_error(exc: UnicodeDecodeError | OSError, given: list[Any]) -> InputError:
    """An environment failure as bad input (exit 2), in one line: a reader that did not name its
    file is told the input paths among ``given`` (a command's arguments: the paths it writes,
    ``--out`` and ``--junit``, are left out: ``_OUTPUT_OPTIONS``); a disk full, a file-size limit, a
    read-only or vanished file names the file."""
    if isinstance(exc, UnicodeDecodeError):
        paths = [*given, *(p for v in given if isinstance(v, list) for p in v)]
        files = [str(v) for v in paths if isinstance(v, Path)]
        return InputError(f"{', '.join(files) or 'an input file'} is not UTF-8 text (byte {exc.start})")
    return InputError(f"{exc.filename or 'a file'}: {exc.strerror or exc}")


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn expected failures into one line on stderr and an exit code; nothing else prints a trace."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BatchtuneError as exc:
            _error_line(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except (UnicodeDecodeError, OSError) as exc:
            inputs = [v for k, v in kwargs.items() if k not in _OUTPUT_OPTIONS]
            _error_line(str(as_input_error(exc, [*args, *inputs])))
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


def _check_out(emit: str | None, out: Path | None) -> None:
    """--emit and --out, checked before anything runs (tune would find a typo after its probe)."""
    from batchtune.errors import InputError
    from batchtune.integrations.emit_base import TRAINERS
    from batchtune.integrations.emit_pretrain import PRETRAIN_TRAINERS

    if out is not None and emit is None:
        raise InputError(
            "--out writes the --emit config: add --emit verl|trl|openrlhf (or, for a pre-training recipe, "
            "megatron|nanogpt|hf|torchtitan)"
        )
    if emit is not None and emit not in (*TRAINERS, *PRETRAIN_TRAINERS):
        raise InputError(
            f"unknown trainer {emit!r} for --emit; choose one of {', '.join(TRAINERS)} (RL), or "
            f"{', '.join(PRETRAIN_TRAINERS)} (a pre-training recipe)"
        )


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
    *,
    efficiency_shown: bool = False,
    stated_run: tuple[int, str] = (0, ""),
) -> None:
    """``efficiency_shown``: the sample-efficiency table is on screen already (tune's first stage);
    ``stated_run``: the full run the recipe states (budget.full_run_*, in samples; 0 = none) and why
    probe.mode = "auto" chose the probe (recipe.probe_choice)."""
    written, replaced = None, False
    if out is not None and trainer is not None and emitted is not None:
        from batchtune.workflow.recommend import write_emitted

        replaced = out.exists()
        written = write_emitted(trainer, emitted, emitted_values, out)
    if json_out:
        from batchtune.report.json import recommendation_to_dict

        data = recommendation_to_dict(rec)
        if rec.schedule is not None:
            from batchtune.report.schedule import schedule_to_dict

            data["batch_schedule"] = schedule_to_dict(rec.schedule, rec.efficiency.unit)
        if rec.async_decision is not None:  # only for a recipe with staleness, reuse or async knobs
            from batchtune.report.joint import joint_to_dict, pick_to_dict

            data["recommended"]["run_as"] = pick_to_dict(rec.async_pick)
            data["async_decision"] = joint_to_dict(rec.async_decision)
        if emitted is not None:
            data["emitted"] = {"text": emitted, "values": emitted_values, "file": written}
        if stated_run[0] and isinstance(data.get("probe_cost"), dict):
            data["probe_cost"]["stated_full_run_samples"] = stated_run[0]
            data["probe_cost"]["ratio_to_stated_run"] = rec.efficiency.total_samples / stated_run[0]
        if stated_run[1]:
            data["probe_choice"] = stated_run[1]
        _print_json(data)
        return
    from batchtune.report.terminal import render_probe_cost, render_recommendation

    render_recommendation(console, rec, emitted, efficiency=not efficiency_shown)
    if rec.async_decision is not None:
        from batchtune.report.joint import render_joint

        render_joint(console, rec.async_decision, rec.winner.label)
    if rec.schedule is not None:
        from batchtune.report.schedule import render_schedule

        render_schedule(console, rec.schedule, rec.efficiency.unit)
    if written is not None:
        again = " (it replaced the file there)" if replaced else ""
        console.print(f"Trainer config written to {written}{again}", highlight=False)
    if rec.efficiency.total_samples and not rec.efficiency.imported:  # logs' runs cost no probing
        from batchtune.analysis.system.hardware import SIMULATED_DEVICE
        from batchtune.workflow.recommend import SIMULATED_TIMINGS

        source = rec.throughput.source
        simulated = SIMULATED_DEVICE in source or SIMULATED_TIMINGS in source
        render_probe_cost(console, rec.efficiency, rec, simulated=simulated)
        if stated_run[0]:
            x = rec.efficiency.total_samples / stated_run[0]
            console.print(
                f"Against the run the recipe states (budget.full_run_*: {stated_run[0]:,} "
                f"{rec.efficiency.unit}): the probe cost {x:.2f}x it",
                highlight=False,
            )
