"""The default off-policy sweep's pruning (analysis/decide/async_sweep.py): which (k, u) the pipeline
model says could beat a simpler cell, by hand."""

from __future__ import annotations

import math

import pytest

from batchtune.analysis.decide.async_sweep import MARGIN, prune_sweep, sweep_grid
from batchtune.errors import AnalysisError


def _kept(cells) -> set[tuple[int, int]]:
    return {(c.staleness, c.updates_per_batch) for c in cells if c.kept}


def test_gen_heavy_batch_keeps_reuse_and_one_step_ahead() -> None:
    # gen 1 s, train 0.5 s per update. Sync: (1 + 0.5u) / u per update = 1.5, 1.0, 0.75. Async on the
    # shared device: max(1, 0.5u) / u = 1.0, 0.5, 0.5: k1u4 ties k1u2, every k >= 2 ties k = 1
    cells = prune_sweep(1.0, 0.5, mini_batches=1)
    assert len(cells) == 12 and {(c.staleness, c.updates_per_batch) for c in cells} == set(sweep_grid(1))
    assert _kept(cells) == {(0, 1), (0, 2), (0, 4), (1, 1), (1, 2)}
    by = {(c.staleness, c.updates_per_batch): c for c in cells}
    assert by[(0, 4)].step_time_s == pytest.approx(0.75) and by[(1, 2)].step_time_s == pytest.approx(0.5)
    assert "k1u2" in by[(1, 4)].reason and "cannot win" in by[(2, 1)].reason


def test_train_bound_batch_prunes_reuse_under_async() -> None:
    # gen 0.1, train 1: async k1u1 is 1.0 s vs sync 1.1 (9% better: kept); k1u2 = 1.0 too: pruned
    assert _kept(prune_sweep(0.1, 1.0, mini_batches=1)) == {(0, 1), (0, 2), (0, 4), (1, 1)}


def test_margin_and_units() -> None:
    # async k1u1 saves (1.0 + t) -> 1.0: kept only when t is more than MARGIN of the sync time
    t = MARGIN / 2
    assert (1, 1) not in _kept(prune_sweep(1.0, t, mini_batches=1, cells=[(0, 1), (1, 1)]))
    assert (1, 1) in _kept(prune_sweep(1.0, 4 * MARGIN, mini_batches=1, cells=[(0, 1), (1, 1)]))
    assert sweep_grid(2) == [(k, u) for k in (0, 1, 2, 4) for u in (2, 4, 8)]
    # a weight sync every 3 steps needs k >= 2; k = 1 is refused, as the trainer refuses it
    cells = prune_sweep(1.0, 0.5, mini_batches=1, cells=[(0, 1), (1, 1), (2, 1)], sync_every=3)
    k1 = next(c for c in cells if c.staleness == 1)
    assert not k1.kept and math.isnan(k1.step_time_s) and "sync every 3" in k1.reason
    with pytest.raises(AnalysisError):
        prune_sweep(0.0, 0.0, mini_batches=1)


def test_variable_generation_keeps_a_deeper_queue() -> None:
    # one slow batch in four (a long-tail batch): with k = 1 it stalls the trainer (1.30 s per
    # update), k = 2 absorbs most of it (1.08 s), k = 4 all of it (1.00 s); constant times tie them all
    trace = [0.5, 0.5, 0.5, 2.5]
    cells = prune_sweep(1.0, 0.9, mini_batches=1, cells=[(0, 1), (1, 1), (2, 1), (4, 1)], gen_trace=trace)
    by = {c.staleness: c for c in cells}
    assert by[1].step_time_s == pytest.approx(1.3017, abs=1e-3)
    assert by[2].kept and by[2].step_time_s == pytest.approx(1.0757, abs=1e-3)
    assert by[4].kept and by[4].step_time_s == pytest.approx(1.0, abs=1e-3)
    flat = prune_sweep(1.0, 0.9, mini_batches=1, cells=[(0, 1), (1, 1), (2, 1)], gen_trace=[1.0] * 4)
    assert {c.staleness for c in flat if c.kept} == {0, 1}


def test_a_steady_trace_prunes_what_its_variation_cannot_pay_for() -> None:
    # a mild spread: k = 2 already absorbs it, so k = 4 ties k = 2 and is pruned
    cells = prune_sweep(1.0, 0.9, mini_batches=1, cells=[(0, 1), (1, 1), (2, 1), (4, 1)],
                        gen_trace=[0.6, 0.8, 1.0, 1.6])  # fmt: skip
    by = {c.staleness: c for c in cells}
    assert by[2].kept and not by[4].kept and "k2u1" in by[4].reason
