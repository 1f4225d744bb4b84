"""The joint sync/async decision (analysis/decide/async_joint.py) as a table, its verdict, and JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from batchtune.analysis.decide.async_rank import (
    AsyncChoice,
    AsyncPick,
    JointDecision,
    JointRow,
    SplitRanking,
    SplitRow,
    queue_cap,
    queue_label,
    split_label,
)
from batchtune.analysis.decide.async_topup import TopUpEnd
from batchtune.report.json import num
from batchtune.report.terminal import fmt_n, fmt_time

SHOWN_ROWS = 12  # the table's rows; --json carries every one
COLUMNS = ("candidate", "mode", "P x G", "k", "u", "split", "queue", "resp/s", "lag", "T", "T interval")


def _cells(row: JointRow, total_gpus: int) -> tuple[str, ...]:
    """One row of the joint ranking as the terminal table and the report show it."""
    c = row.choice
    return (
        row.label,
        c.mode,
        f"{row.prompts}x{row.group_size}",
        str(c.staleness),
        str(c.updates_per_batch),
        split_label(c, total_gpus),  # the verdict's words too (async_rank.async_verdict)
        queue_label(c),
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


SHOWN_SPLIT_ROWS = 10
SPLIT_COLUMNS = ("candidate", "mode", "split", "queue", "resp/s", "rollout idle", "trainer idle", "T", "why")


def shown_splits(splits: SplitRanking, winner: str) -> list[SplitRow]:
    """The winner's rows (every split) first, then the best others, SHOWN_SPLIT_ROWS in all."""
    mine = [r for r in splits.rows if r.label == winner]
    rest = [r for r in splits.rows if r.label != winner]
    return (mine + rest)[: max(SHOWN_SPLIT_ROWS, len(mine))]


def _split_cells(row: SplitRow, total: int) -> tuple[str, ...]:
    c: AsyncChoice = row.choice
    return (
        row.label,
        c.mode,
        split_label(c, total),
        queue_label(c),
        fmt_n(c.responses_per_s),
        f"{c.rollout_idle_frac:.0%}",
        f"{c.trainer_idle_frac:.0%}",
        f"{fmt_time(c.t)} [{fmt_time(c.t_lo)}, {fmt_time(c.t_hi)}]",
        row.reason,
    )


def split_lines(splits: SplitRanking, winner: str) -> list[str]:
    """What the split ranking says beyond its table: modelled, and who it ranks first."""
    out = list(splits.notes)
    if splits.rows and splits.rows[0].label != winner:
        top = splits.rows[0]
        out.append(
            f"on {splits.total_gpus} GPUs the model ranks {top.label} ({top.choice.mode}) first, "
            f"ahead of the pick measured here, {winner}: modelled, not measured"
        )
    return out


def split_table(splits: SplitRanking, winner: str) -> Table:
    n = splits.total_gpus
    table = Table(title=f"GPU split of {n} GPUs, rollout:train (modelled, not measured)")
    for col in SPLIT_COLUMNS:
        table.add_column(col, justify="left" if col in ("candidate", "mode", "split", "why") else "right")
    for row in shown_splits(splits, winner):
        table.add_row(*_split_cells(row, n), style="bold green" if row.label == winner else None)
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
        else f"{pick.rollout_gpus} rollout GPU(s) : {pick.train_gpus} training GPU(s) (the split is "
        "modelled, not measured)"
    )
    # --emit took another modelled split than the model's best (integrations/emit.py): say which, why
    why = f" {pick.split_note[:1].upper()}{pick.split_note[1:]}." if pick.split_note else ""
    return (
        f"Run it async: rollouts at most k = {pick.staleness} trainer step(s) old, {reuse}, a weight sync "
        f"every {pick.sync_every} step(s), {cap}, {where}.{why}"
    )


def render_joint(console: Console, decision: JointDecision, winner: str) -> None:
    console.print(joint_table(decision, winner))
    console.print(f"Verdict: [bold]{decision.verdict[-1]}[/]", highlight=False)
    for line in decision.verdict[:-1]:
        console.print(f"  {line}", highlight=False)
    if decision.pick is not None:
        console.print(pick_words(decision.pick), highlight=False)
    console.print(f"[dim]{decision.times_source}[/]", highlight=False)
    for n in decision.notes:  # a near tie the probe's seeds could not order stands out
        style = "bold yellow" if n.startswith("NOT RESOLVED") else "yellow"
        console.print(f"[{style}]note:[/] {n}", highlight=False)
    if decision.splits is not None:
        console.print(split_table(decision.splits, winner))
        for n in split_lines(decision.splits, winner):
            console.print(f"[yellow]note:[/] {n}", highlight=False)


def pick_split(pick: AsyncPick) -> str:
    """The pick's ``split`` in split_label's words: "colocated", "shared" or rollout:train."""
    if pick.mode == "sync":
        return "colocated"
    return "shared" if pick.rollout_gpus is None else f"{pick.rollout_gpus}:{pick.train_gpus}"


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
        "rollout_gpus": pick.rollout_gpus,  # null: colocated or shared (split says which)
        "train_gpus": pick.train_gpus,
        "total_gpus": pick.total_gpus,
        "split": pick_split(pick),
        # only where --emit wrote another modelled split than the model's best: which and why
        **({"split_note": pick.split_note} if pick.split_note else {}),
    }


def _ranked(rank: int, row: JointRow | SplitRow) -> dict[str, Any]:
    """The keys a ranked row's JSON starts with (the candidates', the GPU splits')."""
    return {"rank": rank, "name": row.label, "mode": row.choice.mode}


def _queued(c: AsyncChoice) -> int:
    """algorithm.in_flight_cap of a choice: finished batches queued (0: the bound alone, or sync)."""
    return 0 if c.mode == "sync" else queue_cap(c.in_flight_cap)


def _time_to_target(c: AsyncChoice) -> dict[str, Any]:
    return {"time_to_target_s": num(c.t), "time_to_target_ci_s": [num(c.t_lo), num(c.t_hi)]}


def joint_to_dict(decision: JointDecision) -> dict[str, Any]:
    rows = []
    for rank, row in enumerate(decision.rows, 1):
        c = row.choice
        rows.append(
            {
                **_ranked(rank, row),
                "prompts": row.prompts,
                "group_size": row.group_size,
                "batch_responses": c.batch,
                "staleness": c.staleness,
                "updates_per_batch": c.updates_per_batch,
                # null: colocated (sync) or shared (async, both sides on one device); split says which
                "rollout_gpus": c.rollout_gpus,
                "split": split_label(c, decision.total_gpus),  # the table's words
                # finished batches queued (algorithm.in_flight_cap; 0: the bound alone, or sync), and
                # the model's count: generated or generating, not yet trained (null: the bound alone)
                "in_flight_cap": _queued(c),
                "in_flight_batches": c.in_flight_cap,
                "responses_per_s": num(c.responses_per_s),
                "lag_reached_updates": num(c.lag_reached),
                "trainer_idle_frac": num(c.trainer_idle_frac),
                "rollout_idle_frac": num(c.rollout_idle_frac),
                **_time_to_target(c),
                # "trace": measured steps' own times played through the simulation; "mean": their means
                "step_times": c.step_times,
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
        "gpu_split": None if decision.splits is None else splits_to_dict(decision.splits),
        "top_up_end": _top_up_end(decision.top_up_end),
    }


def _top_up_end(end: TopUpEnd | None) -> dict[str, Any] | None:
    """Where the probe's seed top-up stopped (null: no sequential rounds ran): the best estimate
    (the probe's own step times), the leaders its paired seeds did not separate from it, and the
    bound their intervals put on what picking it may cost (``resolved``: none open)."""
    if end is None:
        return None
    return {
        "best": end.best,
        "best_seeds": end.seeds,
        "cap": end.cap,  # budget.async_top_up_max_seeds (0: a record before the field)
        "compared": end.compared,  # other candidates compared with the best (0: none within the margin)
        "resolved": not end.open,
        "cost_bound": num(end.bound()),  # at most this x the best's time, by the intervals; "inf": unbounded
        "tolerance": end.tol,
        "not_separated": [
            {"name": o.label, "t_ratio": num(o.ratio), "t_ratio_low": num(o.low), "seeds": o.seeds}
            for o in end.open
        ],
    }


def splits_to_dict(splits: SplitRanking) -> dict[str, Any]:
    n = splits.total_gpus
    rows = []
    for rank, row in enumerate(splits.rows, 1):
        c = row.choice
        rows.append(
            {
                **_ranked(rank, row),
                "rollout_gpus": c.rollout_gpus,  # null: colocated on every GPU
                "train_gpus": None if c.rollout_gpus is None else n - c.rollout_gpus,
                "split": split_label(c, n),
                "in_flight_cap": _queued(c),
                "responses_per_s": num(c.responses_per_s),
                "rollout_idle_frac": num(c.rollout_idle_frac),
                "trainer_idle_frac": num(c.trainer_idle_frac),
                **_time_to_target(c),
                "reason": row.reason,
            }
        )
    return {"total_gpus": n, "modelled": True, "notes": list(splits.notes), "rows": rows}


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
    paras += [f"{decision.times_source}.", *decision.notes]
    if decision.splits is not None:
        winner = decision.pick.label if decision.pick is not None else ""
        best = decision.splits.best_for(winner) if winner else None
        if best is not None:
            paras.append(f"GPU split of {decision.splits.total_gpus} GPUs for {winner}: {best.reason}.")
        paras += split_lines(decision.splits, winner)
    return tuple(paras)
