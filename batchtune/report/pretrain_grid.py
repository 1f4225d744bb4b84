"""Terminal tables and the B_opt/B_min-vs-loss PNG of the pre-training probe (analysis/pretrain/grid)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from batchtune.analysis.pretrain.refine import refine_note


def _k(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else (f"{x / 1e3:.1f}k" if x >= 1e4 else f"{x:.0f}")


def _ci(ci: tuple | None) -> str:
    return "-" if ci is None else f"{_k(ci[0])}..{_k(ci[1])}"


def render_pretrain_grid(console: Console, result: Any) -> None:
    """The probe's tables (:func:`render_grid`), its refinement rounds, and where its runs and plot are."""
    render_grid(console, result.analysis, getattr(result, "seq_len", 1))
    for r in getattr(result, "refinement", ()):
        added = ", ".join(f"{b:,}" for b in r.batches_tokens) or "none"
        if getattr(r, "seeds", ()):
            seeds = ", ".join(map(str, r.seeds))
            console.print(f"Refinement round {r.round} (seeds): seeds {seeds} at {added} tokens")
        else:
            console.print(f"Refinement round {r.round}: added batches {added} tokens")
        for why in r.reasons:
            console.print(f"  {why}")
        if r.left_out:
            left = ", ".join(f"{b:,}" for b in r.left_out)
            console.print(f"  not added ({left}): probe.refine_max_batches reached; raise it to add them")
    console.print(
        f"{result.runs_done} run(s) done in {result.wall_s:.0f} s; results in {result.results_dir}"
        + (f"; plot {result.plot_path}" if result.plot_path else "")
    )


def _interval_kinds(console: Console, estimates: Any) -> None:
    """One line per kind of interval shown, with the targets it is at."""
    kinds: dict[str, list[str]] = {}
    for est in estimates:
        for name, kind in (("B_opt", est.b_opt_ci_kind), ("B_min", est.b_min_ci_kind)):
            if kind:
                kinds.setdefault(f"{name} interval: {kind}", []).append(f"{est.target_loss:g}")
    for line, losses in kinds.items():
        console.print(f"  {line} (L={', '.join(losses)})")


def render_grid(console: Console, a: Any, seq_len: int = 1) -> None:
    """Tokens to target per batch and target, B_opt and B_min with brackets and intervals, notes,
    and the schedule, from an ``analysis.pretrain.grid.GridAnalysis``."""
    if not a.estimates:
        console.print("no target losses to analyse")
        return
    batches = a.estimates[0].batches_tokens
    t = Table(title="Tokens to target (steps), median over seeds; - = never reached within the budget")
    t.add_column("batch (tokens)", justify="right")
    for est in a.estimates:
        t.add_column(f"L={est.target_loss:g}", justify="right")
    for j, b in enumerate(batches):
        cells = []
        for est in a.estimates:
            e, s = est.tokens_to_target[j], est.steps_to_target[j]
            mark = " *" if est.b_opt_measured_tokens == b else ""
            cells.append("-" if not math.isfinite(e) else f"{_k(e)} ({s:.0f}){mark}")
        t.add_row(_k(b), *cells)
    console.print(t)
    console.print("* fewest tokens at that target (the measured B_opt)")
    s = Table(
        title=f"B_opt and B_min per target loss ({a.estimates[0].confidence:.0%} intervals, named below)"
    )
    for col in (
        "target",
        "B_opt",
        "from",
        "bracket",
        "interval",
        "fit rms",
        "B_min",
        "from",
        "bracket",
        "interval",
    ):
        s.add_column(col, justify="right")
    for est in a.estimates:
        br = est.b_min_bracket
        s.add_row(
            f"{est.target_loss:g}",
            _k(est.b_opt_tokens),
            est.b_opt_source,
            _ci(est.b_opt_bracket),
            _ci(est.b_opt_ci),
            "-" if est.b_opt_fit_resid is None else f"{est.b_opt_fit_resid:.3f}",
            _k(est.b_min_tokens),
            est.b_min_source,
            "-" if br is None else f"{_k(br[0]) if br[0] else '<grid'}..{_k(br[1])}",
            _ci(est.b_min_ci),
        )
    console.print(s)
    _interval_kinds(console, a.estimates)
    for est in a.estimates:
        refine = refine_note(est.batches_tokens, est.b_opt_measured_tokens, seq_len)
        for note in (*est.notes, *([refine] if refine else [])):
            console.print(f"  L={est.target_loss:g}: {note}")
    if a.loss_floor is not None:
        console.print(f"loss floor of the data (exact entropy rate): {a.loss_floor:.4f} nats/token")
    if a.schedule:
        console.print("Token-keyed schedule (B_opt per target, never shrinking, inside the measured range):")
        for st in a.schedule:
            console.print(
                f"  from {_k(st.start_tokens)} tokens: batch {_k(st.batch_tokens)} tokens, lr {st.lr:.3g}"
            )
    for note in a.schedule_notes:
        console.print(f"  schedule: {note}")


def plot_bopt_bmin(analysis: Any, path: Path) -> Path:
    """B_opt (with interval) and B_min (bracket) against the target loss, log batch axis."""
    from batchtune.report.plots import _figure, _save

    fig, (ax,) = _figure(1, width=6.0, height=4.2)
    rows = [e for e in analysis.estimates if e.b_opt_tokens is not None]
    losses = [e.target_loss for e in rows]
    bopt = [e.b_opt_tokens for e in rows]
    lo = [e.b_opt_ci[0] if e.b_opt_ci else b for e, b in zip(rows, bopt, strict=True)]
    hi = [e.b_opt_ci[1] if e.b_opt_ci else b for e, b in zip(rows, bopt, strict=True)]
    err = [[b - x for b, x in zip(bopt, lo, strict=True)], [x - b for b, x in zip(bopt, hi, strict=True)]]
    ax.errorbar(losses, bopt, yerr=err,
                marker="o", capsize=3, label="B_opt (90% interval)")  # fmt: skip
    for e in analysis.estimates:
        if e.b_min_bracket is not None:
            low = e.b_min_bracket[0] or min(e.batches_tokens) / 2
            ax.plot([e.target_loss] * 2, [low, e.b_min_bracket[1]], color="tab:red", lw=6, alpha=0.35)
            if e.b_min_tokens is not None:
                ax.plot(e.target_loss, e.b_min_tokens, "s", color="tab:red")
    ax.plot([], [], "s-", color="tab:red", alpha=0.5, label="B_min (estimate, bracket)")
    ax.set_yscale("log")
    ax.set_xlabel("target eval loss (nats/token)")
    ax.set_ylabel("batch (tokens)")
    ax.invert_xaxis()
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)
