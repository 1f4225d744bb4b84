"""Terminal tables of a generation/training profile and of a roofline-only prediction."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from batchtune.report.terminal import fmt_n


def render_profile(console: Console, result: Any) -> None:
    hw = result.hardware.name if result.hardware else "none"
    console.print(
        f"Profile {result.profile_id}: {result.backend} on {result.device}, model "
        f"{result.model_info.name if result.model_info else result.model}, "
        f"roofline hardware: {hw}, {result.wall_s:.1f} s"
    )
    note = getattr(result, "contention_note", None)
    retimed = getattr(result, "retimed", "")
    if retimed:
        console.print(f"[yellow]Re-timed:[/] {retimed}", highlight=False)
    if note:
        console.print(f"[yellow]Contended:[/] {note}", highlight=False)
    for name, mode in result.modes.items():
        bound = {rp.concurrency: rp for rp in mode.roofline}
        title = "fixed length (EOS ignored)" if name == "fixed" else "real stopping (long-tailed lengths)"
        table = Table(title=f"Generation, {title}")
        for col in ("responses in flight", "responses/s", "tokens/s", "batch s", "peak mem", "of roofline"):
            table.add_column(col, justify="right")
        table.add_column("status")
        knee = mode.critical_concurrency
        for p in mode.points:
            rp = bound.get(p.concurrency)
            mark = " <- knee" if p.concurrency == knee else ""
            table.add_row(
                str(p.concurrency),
                fmt_n(p.responses_per_s) if p.status == "ok" else "-",
                fmt_n(p.output_tokens_per_s) if p.status == "ok" else "-",
                f"{p.step_latency_s:.3g}" if p.status == "ok" else "-",
                _mem(p.peak_mem_bytes),
                f"{rp.fraction_of_bound:.0%}" if rp else "-",
                (p.status if p.status == "ok" else f"[magenta]{p.status}[/] {p.message[:60]}") + mark,
            )
        console.print(table)
        if mode.knee is not None:
            console.print(f"Critical generation batch ({name}): {knee}. {mode.knee.reason}")
        if mode.note:
            console.print(f"[yellow]note:[/] {mode.note}")
    if result.train_points:
        table = Table(title="Training step time (forward + backward + optimiser step)")
        for col in ("batch (responses)", "step s", "peak mem", "status"):
            table.add_column(col, justify="right")
        for p in result.train_points:
            table.add_row(
                str(p.concurrency),
                f"{p.step_latency_s:.3g}" if p.status == "ok" else "-",
                _mem(p.peak_mem_bytes),
                p.status,
            )
        console.print(table)
        if result.train_fit is not None:
            f = result.train_fit
            console.print(f"Training time model: {f.t0_s:.3g} s + {f.t1_s_per_sample:.3g} s per response")
    if result.train_note:
        console.print(f"[yellow]note:[/] {result.train_note}")
    if result.roofline_note:
        console.print(f"[yellow]roofline:[/] {result.roofline_note}")


def render_prediction(console: Console, pred: Any) -> None:
    c = pred.curve
    table = Table(
        title=f"PREDICTION (roofline only, no engine run): {pred.model_info.name} on {pred.hardware.name}"
    )
    for col in ("concurrency", "step bound s", "tokens/s bound", "bound by", "fits in memory"):
        table.add_column(col, justify="right")
    for i in range(c.concurrency.size):
        table.add_row(
            str(int(c.concurrency[i])),
            f"{c.step_time_bound_s[i]:.3g}",
            fmt_n(float(c.tokens_per_s_bound[i])),
            "compute" if c.compute_bound[i] else "memory",
            "yes" if c.fits_in_memory[i] else "no",
        )
    console.print(table)
    cb = c.compute_bound_concurrency
    head = (
        f"Compute-bound above ~{fmt_n(cb)} concurrent sequences"
        if cb != float("inf")
        else "Never compute-bound at this context (KV-cache reads outweigh the FLOPs)"
    )
    console.print(
        f"{head}; memory holds ~{fmt_n(pred.max_concurrency_by_memory)} sequences "
        f"at {pred.context_tokens:.0f} tokens of context."
    )
    console.print(f"[yellow]{pred.note}[/]")


def _mem(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n else "-"
