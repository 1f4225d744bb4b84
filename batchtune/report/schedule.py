"""The batch schedule of a recommendation (analysis/branched/schedule.py): a rich table and JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from batchtune.analysis.branched.schedule import ScheduleComparison
from batchtune.report.json import num


def schedule_table(cmp: ScheduleComparison, unit: str = "samples") -> Table:
    t = Table(title="Batch schedule (from the local ratios measured at each checkpoint)")
    for col in ("stage", "batch", "lr", f"from {unit}", f"to {unit}", "steps", "local B_crit", "time s"):
        t.add_column(col, justify="right")
    for i, st in enumerate(cmp.stages):
        t.add_row(
            str(i + 1),
            f"{st.label} ({st.batch_responses})",
            f"{st.lr:.3g}",
            f"{st.start_samples:,.0f}",
            f"{st.end_samples:,.0f}",
            f"{st.steps:,.1f}",
            f"{st.local_critical:,.0f}",
            f"{st.time_s:,.4g}",
        )
    return t


def render_schedule(console: Console, cmp: ScheduleComparison, unit: str = "samples") -> None:
    """``unit``: what the stages' bounds count ("tokens" for a pre-training recipe)."""
    console.print(schedule_table(cmp, unit))
    v = cmp.verdict(unit)
    console.print(v[0].upper() + v[1:] + ".", highlight=False)
    for n in cmp.notes:
        console.print(f"[yellow]note:[/] {n}")


def _outcome(o: Any) -> dict[str, Any]:
    return {"samples": num(o.samples), "steps": num(o.steps), "time_s": num(o.time_s)}


def schedule_to_dict(cmp: ScheduleComparison, unit: str = "samples") -> dict[str, Any]:
    return {
        "stages": [
            {
                "name": st.label,
                "prompts": st.prompts,
                "group_size": st.group_size,
                "batch_responses": st.batch_responses,
                "lr": num(st.lr),
                "start_samples": num(st.start_samples),
                "end_samples": num(st.end_samples),
                "steps": num(st.steps),
                "start_progress_samples": num(st.start_progress),
                "local_critical_batch": num(st.local_critical),
                "time_s": num(st.time_s),
            }
            for st in cmp.stages
        ],
        "schedule": _outcome(cmp.schedule),
        "best_fixed": {"name": cmp.best_fixed, **_outcome(cmp.fixed[cmp.best_fixed])},
        "fixed": {k: _outcome(v) for k, v in cmp.fixed.items()},
        "time_ratio": num(cmp.time_ratio),
        "steps_ratio": num(cmp.steps_ratio),
        "winner": cmp.winner,
        "verdict": cmp.verdict(unit),
        "notes": list(cmp.notes),
    }
