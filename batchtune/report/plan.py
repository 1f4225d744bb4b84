"""The probe's cost preview (`batchtune plan`, `probe --dry-run`): a table, a summary, and JSON."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rich.console import Console
from rich.table import Table

from batchtune.report.terminal import fmt_n, fmt_time


def plan_to_dict(preview: Any) -> dict[str, Any]:
    """Keys carry their units (``_s``, ``_samples``); NaN (not timed) becomes null in codec.dumps."""
    data = dataclasses.asdict(preview)
    data["notes"] = list(preview.notes)
    return data


def plan_table(preview: Any) -> Table:
    table = Table(title=f"Probe plan: {preview.runs} runs ({preview.backend} backend), upper bounds")
    cols = ("candidate", "P x G", "N", "LR", "seeds", "samples/run", "steps/run", "evals/run")
    timed = ("s/step", "s/run")
    for col in cols + (timed if preview.timed_steps else ()):
        table.add_column(col, justify="left" if col == "candidate" else "right")
    for c in preview.candidates:
        row = [
            c.label + (" (ref)" if c.label == preview.reference else ""),
            f"{c.prompts} x {c.group_size}",
            str(c.batch_responses),
            f"{c.lr:.3g}",
            str(c.seeds),
            f"{c.max_samples_per_run:,}",
            f"{c.max_steps_per_run:,}",
            str(c.evals_per_run),
        ]
        if preview.timed_steps:
            row += [fmt_n(c.step_s), fmt_time(c.run_s_max) if math.isfinite(c.run_s_max) else "-"]
        table.add_row(*row)
    return table


def plan_summary(preview: Any) -> list[str]:
    p = preview
    lines = [
        f"Probe budget: {p.total_samples_max:,} samples in {p.total_steps_max:,} steps at most = "
        f"{p.cost_vs_reference_run:.1f}x one full run at the reference {p.reference} "
        f"({p.reference_run_samples:,} samples)",
    ]
    if math.isfinite(p.wall_s_max):
        text = f"Predicted wall time here: at most {fmt_time(p.wall_s_max)} with {p.workers} run(s) at a time"
        if math.isfinite(p.reference_run_s):
            text += f" (one full reference run: {fmt_time(p.reference_run_s)})"
        if p.one_off_s > 0:
            text += f"; includes {fmt_time(p.one_off_s)} paid once (cached warm start)"
        lines.append(text)
    if p.gpus:
        lines.append(
            f"GPU-hours at the recipe's scale ({p.gpus} GPU(s) per run): at most {p.gpu_hours_max:.2f}"
        )
    lines.append(f"Timing: {p.timing_source}")
    if p.runs_finished:
        lines.append(
            f"{p.runs_finished} of {p.runs} runs already finished in {p.results_dir}: a probe reuses them"
        )
    lines.extend(f"[yellow]note:[/] {n}" for n in p.notes)
    lines.append(f"Run it: batchtune probe {p.source or ''}".rstrip())
    return lines


def render_plan(console: Console, preview: Any) -> None:
    console.print(plan_table(preview))
    for line in plan_summary(preview):
        console.print(line, highlight=False)
