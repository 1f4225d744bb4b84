"""A branched probe on the terminal and in --json: the local critical batch at each checkpoint, its
trend against samples consumed, and what the probe cost."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from batchtune.analysis.branched.summary import BranchedSummary
from batchtune.report.json import num


def _g(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:,.0f}"


def branched_to_dict(sm: BranchedSummary) -> dict[str, Any]:
    r0, lo0, hi0 = sm.reference_samples_to_target
    return {
        "trunk_samples": num(sm.trunk_samples),
        "branch_samples": num(sm.branch_samples),
        "reference_samples_to_target": [num(r0), num(lo0), num(hi0)],
        "reference_extrapolated": sm.extrapolated,
        "checkpoints": [
            {
                "samples": num(lc.checkpoint_samples),
                "metric_at_checkpoint": num(lc.start_value),
                "local_target": num(lc.level),
                "window_samples": num(lc.window_samples),
                "own_windows": {f"{b:g}": num(v) for b, v in lc.windows.items()},
                "local_critical_batch": num(lc.point),
                "local_critical_batch_ci": [num(v) for v in lc.interval],
                "branch_samples": num(lc.branch_samples),
                "ratios": {f"{b:g}": {str(s): num(r) for s, r in rs.items()} for b, rs in lc.ratios.items()},
            }
            for lc in sm.locals
        ],
        "critical_at_target": None
        if sm.critical_at_target is None
        else [num(v) for v in sm.critical_at_target],
        "progress_fit": None
        if sm.progress is None
        else {
            "log_intercept": sm.progress.intercept,
            "log_slope": sm.progress.slope,
            "points": sm.progress.n_points,
        },
    }


def render_branched(console: Console, sm: BranchedSummary) -> None:
    table = Table(title="Local critical batch at each checkpoint of the trunk (Merrill et al. 2025)")
    u = sm.efficiency.unit
    for col in (
        f"checkpoint ({u})",
        "metric there",
        "local target",
        "local B_crit",
        "interval",
        f"branch {u}",
    ):
        table.add_column(col, justify="right")
    for lc in sm.locals:
        lo, hi = lc.interval
        table.add_row(
            _g(lc.checkpoint_samples),
            f"{lc.start_value:.4g}",
            f"{lc.level:.4g}",
            _g(lc.point),
            f"[{_g(lo)}, {_g(hi)}]",
            _g(lc.branch_samples),
        )
    console.print(table)
    r0, lo0, hi0 = sm.reference_samples_to_target
    what = "extrapolated" if sm.extrapolated else "measured"
    console.print(f"Reference {u}-to-target ({what}): {_g(r0)} [{_g(lo0)}, {_g(hi0)}]")
    if sm.critical_at_target is not None:
        p, lo, hi = sm.critical_at_target
        console.print(
            f"Local critical batch at the target, from its trend: {_g(p)} [{_g(lo)}, {_g(hi)}] "
            "(an extrapolation past the last checkpoint)"
        )
    console.print(f"Trunk {_g(sm.trunk_samples)} + branches {_g(sm.branch_samples)} {u}")
