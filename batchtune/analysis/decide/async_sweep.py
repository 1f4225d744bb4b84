"""Which (staleness k, updates per batch u) a probe should run at a batch, before any of them runs
(issue 30 item 3, ``probe.async_sweep = "auto"``): the default sweep k in {0, 1, 2, 4} x u in
mini_batches x {1, 2, 4}, pruned where the pipeline model says a cell cannot win.

Time-to-target is T = U x tau: U the optimiser updates to reach the target, tau the wall seconds per
update (pipeline.py ``step_time_s``). Best case for a cell: U at its on-policy value (R(B, k, u) =
R(B, 0, 1) / u: staleness costs nothing and every reused update is as good as a fresh batch) and tau
with generation and training overlapping freely on the device (the two processes do not slow each
other). Neither staleness nor reuse can make U smaller than that, so U only grows with k and u; a
cell (k, u) therefore cannot beat a simpler cell (k' <= k, u' <= u) whose tau is no larger. A cell is
kept when its best-case tau is at least ``MARGIN`` below every simpler cell's, else pruned, naming the
simpler cell. R(B) itself is unknown before the probe, so batches are not compared with each other.

Where the throughput side depends on k: with constant stage times one batch ahead (k = 1) already
reaches full overlap, so every larger k ties it and is pruned. Measured step times vary (a batch of
long responses generates slower), and a deeper queue absorbs that: with k = 1 a slow batch stalls the
trainer, with k = 2 the batch queued before it keeps the trainer busy. So ``gen_trace`` /
``train_trace`` (the timed steps' own times, in order) are played through the pipeline simulation
(``simulate_pipeline``), and a k >= 2 cell is kept when its time per update is ``MARGIN`` below
k = 1's there. Pure, no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from batchtune.analysis.system.pipeline import predict_pipeline, simulate_pipeline
from batchtune.errors import AnalysisError

SWEEP_STALENESS = (0, 1, 2, 4)
SWEEP_EPOCHS = (1, 2, 4)  # u = mini_batches x epochs
MARGIN = 0.02  # a knob must buy this much time per update over every simpler cell to be run


@dataclass(frozen=True)
class SweepCell:
    staleness: int  # k, trainer steps
    updates_per_batch: int  # u
    step_time_s: float  # best-case wall seconds per optimiser update
    kept: bool
    reason: str  # why it was pruned; "" when kept


def sweep_grid(mini_batches: int) -> list[tuple[int, int]]:
    """Every (k, u) of the default sweep."""
    return [(k, mini_batches * e) for k in SWEEP_STALENESS for e in SWEEP_EPOCHS]


def _tau(
    k: int,
    u: int,
    gen: float,
    upd: float,
    sync: float,
    sync_every: int,
    traces: tuple[Sequence[float], Sequence[float]] = ((), ()),
) -> float:
    gen_trace, upd_trace = traces
    if k == 0:  # the sync closed form
        return predict_pipeline(
            "sync",
            batch_responses=1,
            gen_time_s=gen,
            train_time_s=upd * u,
            sync_time_s=sync,
            updates_per_batch=u,
        ).step_time_s
    return simulate_pipeline(  # predict_pipeline("async") is this without traces; with them, the
        batch_responses=1,  # measured variation plays against the bounds
        gen_time_s=gen,
        train_time_s=upd * u,
        sync_time_s=sync,
        staleness_bound=k * u,
        in_flight_cap=None,
        sync_every=u * sync_every,
        updates_per_batch=u,
        gen_trace=gen_trace,
        train_trace=[x * u for x in upd_trace],
    ).step_time_s


def prune_sweep(
    gen_time_s: float,
    train_update_s: float,
    *,
    mini_batches: int,
    cells: Sequence[tuple[int, int]] | None = None,
    sync_time_s: float = 0.0,
    sync_every: int = 1,
    gen_trace: Sequence[float] = (),
    train_trace: Sequence[float] = (),
) -> list[SweepCell]:
    """Each (k, u) of ``cells`` (default ``sweep_grid``) at one batch, kept or pruned (module
    docstring). ``gen_time_s``: one rollout batch; ``train_update_s``: one update on it;
    ``sync_every``: trainer steps per weight sync (k >= 1 needs sync_every <= k + 1);
    ``gen_trace`` / ``train_trace``: the measured per-batch generation and per-update training
    seconds, in order (the constants are then their means)."""
    if gen_trace:
        gen_time_s = statistics.fmean(gen_trace)
    if train_trace:
        train_update_s = statistics.fmean(train_trace)
    if gen_time_s < 0 or train_update_s < 0 or gen_time_s + train_update_s <= 0:
        raise AnalysisError(f"stage times must be >= 0 and not both 0: {gen_time_s}, {train_update_s}")
    grid = list(cells) if cells is not None else sweep_grid(mini_batches)
    base = (0, mini_batches)
    if base not in grid:
        grid = [base, *grid]
    ok = [(k, u) for k, u in grid if k == 0 or k + 1 >= sync_every]
    traces = (tuple(gen_trace), tuple(train_trace))
    tau = {(k, u): _tau(k, u, gen_time_s, train_update_s, sync_time_s, sync_every, traces) for k, u in ok}
    out = []
    for k, u in grid:
        if (k, u) not in tau:
            out.append(
                SweepCell(
                    k, u, float("nan"), False, f"k = {k} cannot keep a weight sync every {sync_every} steps"
                )
            )
            continue
        simpler = [c for c in tau if c[0] <= k and c[1] <= u and c != (k, u)]
        if not simpler:
            out.append(SweepCell(k, u, tau[(k, u)], True, ""))
            continue
        best = min(simpler, key=lambda c: (tau[c], c))
        t, tb = tau[(k, u)], tau[best]
        if t < tb * (1 - MARGIN):
            out.append(SweepCell(k, u, t, True, ""))
            continue
        why = (
            f"its best case, {t:.3g} s per update (staleness free, every reused update as good as a "
            f"fresh batch, free overlap), is not {MARGIN:.0%} below k{best[0]}u{best[1]}'s {tb:.3g} s: "
            "it cannot win"
        )
        out.append(SweepCell(k, u, t, False, why))
    return out
