"""The joint sync/async decision (analysis/decide/async_joint.py) as a table, its verdict, and JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from batchtune.analysis.decide.async_rank import AsyncPick, JointDecision, JointRow, queue_cap
from batchtune.report.json import num
from batchtune.report.terminal import fmt_n, fmt_time

SHOWN_ROWS = 12  # the table's rows; --json carries every one
COLUMNS = ("candidate", "mode", "P x G", "k", "u", "split", "queue", "resp/s", "lag", "T", "T interval")


def _split(row: JointRow, total_gpus: int) -> str:
    """Rollout:training GPUs; "shared" on one device (two processes, each side the whole of it)."""
    g = row.choice.rollout_gpus
    if g is None:
        return "colocated"
    return "shared" if total_gpus == 1 else f"{g}:{total_gpus - g}"


def _cap(row: JointRow) -> str:
    """Finished batches queued, as algorithm.in_flight_cap counts them; "k": the bound alone."""
    c = row.choice
    if c.mode == "sync":
        return "-"
    return "k" if c.in_flight_cap is None else str(queue_cap(c.in_flight_cap))


def _cells(row: JointRow, total_gpus: int) -> tuple[str, ...]:
    """One row of the joint ranking as the terminal table and the report show it."""
    c = row.choice
    return (
        row.label,
        c.mode,
        f"{row.prompts}x{row.group_size}",
        str(c.staleness),
        str(c.updates_per_batch),
        _split(row, total_gpus),
        _cap(row),
        fmt_n(c.responses_per_s),
        f"{c.lag_reached:.2f}",
        fmt_time(c.t),
        f"[{fmt_time(c.t_lo)}, {fmt_time(c.t_hi)}]",
    )


def joint_table(decision: JointDecision, winner: str) -> Table:
    table = Table(title="Sync or async: predicted time-to-target over mode, batch, staleness k, updates u")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("candidate", "mode", "split") else "right")
    for row in decision.rows[:SHOWN_ROWS]:
        style = "bold green" if row.label == winner else None
        table.add_row(*_cells(row, decision.total_gpus), style=style)
    if len(decision.rows) > SHOWN_ROWS:
        table.caption = f"{len(decision.rows) - SHOWN_ROWS} more rows in --json"
    return table


def pick_words(pick: AsyncPick) -> str:
    """How to run the pick, in one line."""
    epochs = pick.updates_per_batch // max(pick.mini_batches, 1)
    reuse = (
        f"{pick.updates_per_batch} update(s) per rollout batch ({pick.mini_batches} mini-batch(es) x "
        f"{epochs} epoch(s))"
    )
    if pick.mode == "sync":
        return f"Run it synchronous and on-policy (k = 0), colocated, {reuse}."
    cap = (
        f"the staleness bound alone ({pick.staleness} finished batch(es) queued)"
        if pick.in_flight_cap == 0
        else f"at most {pick.in_flight_cap} finished batch(es) queued"
    )
    where = (
        "rollout and trainer sharing the one device"
        if pick.total_gpus == 1
        else f"{pick.rollout_gpus} rollout GPU(s) : {pick.train_gpus} training GPU(s)"
    )
    return (
        f"Run it async: rollouts at most k = {pick.staleness} trainer step(s) old, {reuse}, a weight sync "
        f"every {pick.sync_every} step(s), {cap}, {where}."
    )


def render_joint(console: Console, decision: JointDecision, winner: str) -> None:
    console.print(joint_table(decision, winner))
    console.print(f"Verdict: [bold]{decision.verdict[-1]}[/]", highlight=False)
    for line in decision.verdict[:-1]:
        console.print(f"  {line}", highlight=False)
    if decision.pick is not None:
        console.print(pick_words(decision.pick), highlight=False)
    console.print(f"[dim]{decision.times_source}[/]", highlight=False)
    for n in decision.notes:
        console.print(f"[yellow]note:[/] {n}", highlight=False)


def pick_to_dict(pick: AsyncPick | None) -> dict[str, Any] | None:
    if pick is None:
        return None
    return {
        "name": pick.label,
        "mode": pick.mode,
        "staleness": pick.staleness,
        "updates_per_batch": pick.updates_per_batch,
        "mini_batches": pick.mini_batches,
        "sync_every": pick.sync_every,
        "in_flight_cap": pick.in_flight_cap,  # finished batches queued; 0 = the staleness bound
        "rollout_gpus": pick.rollout_gpus,
        "train_gpus": pick.train_gpus,
        "total_gpus": pick.total_gpus,
    }


def joint_to_dict(decision: JointDecision) -> dict[str, Any]:
    rows = []
    for rank, row in enumerate(decision.rows, 1):
        c = row.choice
        rows.append(
            {
                "rank": rank,
                "name": row.label,
                "mode": c.mode,
                "prompts": row.prompts,
                "group_size": row.group_size,
                "batch_responses": c.batch,
                "staleness": c.staleness,
                "updates_per_batch": c.updates_per_batch,
                "rollout_gpus": c.rollout_gpus,  # null: colocated
                # finished batches queued (algorithm.in_flight_cap; 0: the bound alone, or sync), and
                # the model's count: generated or generating, not yet trained (null: the bound alone)
                "in_flight_cap": 0 if c.mode == "sync" else queue_cap(c.in_flight_cap),
                "in_flight_batches": c.in_flight_cap,
                "responses_per_s": num(c.responses_per_s),
                "lag_reached_updates": num(c.lag_reached),
                "trainer_idle_frac": num(c.trainer_idle_frac),
                "rollout_idle_frac": num(c.rollout_idle_frac),
                "time_to_target_s": num(c.t),
                "time_to_target_ci_s": [num(c.t_lo), num(c.t_hi)],
            }
        )
    return {
        "status": decision.status,
        "verdict": decision.verdict[-1] if decision.verdict else None,
        "reasons": list(decision.verdict),
        "pick": pick_to_dict(decision.pick),
        "times_source": decision.times_source,
        "total_gpus": decision.total_gpus,
        "notes": list(decision.notes),
        "candidates": rows,
    }


def joint_rows(decision: JointDecision) -> tuple[tuple[str, ...], ...]:
    """The ranking as plain rows, header first (the HTML and Markdown report)."""
    rows: list[tuple[str, ...]] = [COLUMNS]
    rows.extend(_cells(row, decision.total_gpus) for row in decision.rows)
    return tuple(rows)


def joint_paragraphs(decision: JointDecision) -> tuple[str, ...]:
    """The verdict, its reasons, how to run the pick, and where the times come from."""
    paras = [f"Verdict: {decision.verdict[-1]}.", *decision.verdict[:-1]]
    if decision.pick is not None:
        paras.append(pick_words(decision.pick))
    return (*paras, f"{decision.times_source}.", *decision.notes)
