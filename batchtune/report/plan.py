"""The probe's cost preview (`batchtune plan`, `probe --dry-run`): a table, a summary, and JSON."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from batchtune.analysis.sample.efficiency import shape_header
from batchtune.report.terminal import fmt_n, fmt_time


def plan_to_dict(preview: Any) -> dict[str, Any]:
    """Keys carry their units (``_s``, ``_samples``); NaN (not timed) becomes null in codec.dumps."""
    data = dataclasses.asdict(preview)
    data["notes"] = list(preview.notes)
    return data


def plan_table(preview: Any) -> Table:
    table = Table(title=f"Probe plan: {preview.runs} runs ({preview.backend} backend), upper bounds")
    shape = shape_header(preview.unit)  # the pre-training grid: sequences x length, tokens per run
    cols = ("candidate", shape, "N", "LR", "seeds", f"{preview.unit}/run", "steps/run", "evals/run")
    _columns(table, cols + (("s/step", "s/run") if preview.timed_steps else ()))
    for c in preview.candidates:
        row = _leading_cells(c, c.label + (" (ref)" if c.label == preview.reference else ""))
        row += [str(c.seeds), f"{c.max_samples_per_run:,}", f"{c.max_steps_per_run:,}"]
        row.append(f"{c.evals_per_run:,}")
        table.add_row(*row, *(_timed_cells(c, c.run_s_max) if preview.timed_steps else ()))
    return table


def _columns(table: Table, cols: tuple[str, ...]) -> None:
    """Both plans' columns: the first (the candidate) left-aligned, the numbers right-aligned."""
    for col in cols:
        table.add_column(col, justify="left" if col == cols[0] else "right")


def _leading_cells(c: Any, label: str) -> list[str]:
    """The cells both plans' rows start with: the candidate, P x G, N and LR."""
    return [label, f"{c.prompts} x {c.group_size}", str(c.batch_responses), f"{c.lr:.3g}"]


def _timed_cells(c: Any, seconds: float) -> list[str]:
    """Seconds a step and ``seconds`` (a run's, a branch's) where steps were timed; "-" where the
    latter is not finite."""
    return [fmt_n(c.step_s), fmt_time(seconds) if math.isfinite(seconds) else "-"]


def plan_summary(preview: Any, run_it: str) -> list[str]:
    p = preview
    lines = [
        f"Probe budget: {p.total_samples_max:,} {p.unit} in {p.total_steps_max:,} steps at most = "
        f"{p.cost_vs_reference_run:.1f}x one full run at the reference {p.reference} "
        f"({p.reference_run_samples:,} {p.unit})",
    ]
    if math.isfinite(p.wall_s_max):
        text = (
            f"Predicted wall time here: {fmt_time(p.wall_s_max)} with every run to its budget, "
            f"{p.workers} run(s) at a time"
        )
        if math.isfinite(p.reference_run_s):
            text += f" (one full reference run: {fmt_time(p.reference_run_s)})"
        if p.one_off_s > 0:
            text += f"; includes {fmt_time(p.one_off_s)} paid once (cached warm start)"
        lines.append(text)
        left = p.runs - p.runs_finished
        if p.runs_finished and left:  # a rerun pays only for what is left
            to_budgets = f"{fmt_time(p.wall_s_left_max)} to their budgets"
            lines.append(f"Left to run: {left} of {p.runs} runs, {to_budgets}")
        elif p.runs_finished:
            lines.append("Left to run: nothing, every run is finished (a probe reads them)")
    reused = f"{p.runs_finished} of {p.runs} runs already finished in {p.results_dir}: a probe reuses them"
    return lines + _closing(p, reused, run_it)


def _closing(p: Any, reused: str, run_it: str) -> list[str]:
    """The lines both plans end with: GPU-hours, where the times come from, what is already there
    (``reused``, said when any run is), the notes, and the command that runs it (``run_it``)."""
    lines = []
    if p.gpus:
        lines.append(
            f"GPU-hours at the recipe's scale ({p.gpus} GPU(s) per run): at most {p.gpu_hours_max:.2f}"
        )
    lines.append(f"Timing: {p.timing_source}")
    if p.runs_finished:
        lines.append(reused)
    lines.extend(f"[yellow]note:[/] {n}" for n in p.notes)
    lines.append(f"Run it: {escape(run_it)}")
    return lines


def branched_plan_table(preview: Any) -> Table:
    p = preview
    title = f"Branched probe plan ({p.backend} backend): branches from the trunk at {p.reference}"
    table = Table(title=title + ", upper bounds")
    shape = shape_header(p.unit)  # a pre-training recipe's token batches: seqs x len
    cols = ("batch", shape, "N", "LR", "window", "steps", "longest branch", "branches")
    _columns(table, cols + (("s/step", "s/branch") if p.timed_steps else ()))
    for c in p.candidates:
        row = _leading_cells(c, c.label)
        row += [f"{c.window_samples:,}", f"{c.window_steps:,}", f"{c.longest_samples:,}"]
        row.append(f"<= {c.branches_max}")
        table.add_row(*row, *(_timed_cells(c, c.branch_s_max) if p.timed_steps else ()))
    return table


def branched_plan_summary(preview: Any, run_it: str) -> list[str]:
    p = preview
    at = ", ".join(f"{c:,}" for c in p.checkpoints)
    n, k = len(p.candidates), p.batches_per_checkpoint_max
    reach = f"every one of the {n} larger batches" if k == n else f"at most {k} of the {n} larger batches"
    if k != n:
        reach += f" (search: {p.search})"
    grid_x = p.grid_samples_max / p.reference_run_samples
    u = p.unit
    lines = [
        f"Trunk: {p.trunk_samples:,} {u} at {p.reference} ({p.reference_batch} per step), "
        f"checkpoints at {at}",
        f"At each checkpoint: a control at {p.reference} per seed (at most "
        f"{p.control_samples_max:,} {u} each) and branches of {reach}, each at {p.seeds} seed(s), "
        f"up to {p.seeds_max} while its verdict is open",
        f"Probe budget: {p.total_samples_max:,} {u} at most = {p.cost_vs_reference_run:.1f}x one "
        f"full run at the reference {p.reference} ({p.reference_run_samples:,} {u}); the grid of "
        f"this recipe: {p.grid_samples_max:,} at most ({grid_x:.1f}x)",
    ]
    if p.offpolicy:
        lines.append(_offpolicy_line(p))
    if math.isfinite(p.wall_s_max):
        lines.append(
            f"Predicted wall time here: {fmt_time(p.wall_s_max)} with every branch to its longest, one "
            f"run at a time (the trunk {fmt_time(p.trunk_s)})"
        )
    reused = (
        f"{p.runs_finished} runs already finished in {p.results_dir}/branched: a probe reuses those its "
        "search asks for"
    )
    return lines + _closing(p, reused, run_it)


def _offpolicy_line(p: Any) -> str:
    """The off-policy branches' share of a branched plan (measure/preview_branched.py)."""
    cells = ", ".join(f"{c.cell} ({c.runs_max} x {c.longest_samples:,})" for c in p.offpolicy)
    text = (
        f"Off-policy branches (cell: runs x {p.unit} at most): {cells}; "
        f"{sum(c.runs_max for c in p.offpolicy)} runs, {p.offpolicy_samples_max:,} {p.unit} at most"
    )
    if math.isfinite(p.offpolicy_s_max):
        text += f", {fmt_time(p.offpolicy_s_max)} of the wall time"
    return text + " (in the budget above)"


def render_plan(console: Console, preview: Any, run_it: str, choice: str = "") -> None:
    """``run_it``: the command line that runs what the plan shows, with the user's options;
    ``choice``: why probe.mode = "auto" chose this probe (recipe.probe_choice), shown first."""
    branched = bool(preview.branched)
    if choice:
        console.print(f"Probe mode: {escape(choice)}", highlight=False)
    console.print(branched_plan_table(preview) if branched else plan_table(preview))
    summary = branched_plan_summary if branched else plan_summary
    for line in summary(preview, run_it):  # the command on one line, to paste as it is
        console.print(line, highlight=False, soft_wrap=line.startswith("Run it: "))
