"""Batch-size schedules from the local critical batch against progress (analysis/schedule.py)."""

from __future__ import annotations

import numpy as np
import pytest

from batchtune.analysis.pretrain_schedule import merrill_batch_warmup
from batchtune.analysis.schedule import ScheduleCandidate, compare_schedule, local_ratio, plan_stages

LADDER = [8, 16, 32, 64, 128, 256, 512]


def _cands(rate=lambda n: n / (1.0 + 0.01 * n)) -> list[ScheduleCandidate]:
    return [ScheduleCandidate(f"P{n // 8}xG8", n // 8, 8, 0.01 * n / 8, rate(n)) for n in LADDER]


def _power(b_at_1000: float, slope: float):
    return lambda p: b_at_1000 * (np.asarray(p, dtype=float) / 1000.0) ** slope


def test_local_ratio_hits_one_plus_tol_at_the_critical_batch():
    assert local_ratio(8, 300.0, 8, 0.1) == pytest.approx(1.0)
    assert local_ratio(300, 300.0, 8, 0.1) == pytest.approx(1.1)
    assert local_ratio(64, 4.0, 8, 0.1) == pytest.approx(8.0, rel=1e-6)  # below (1+tol) B0: r = B/B0


def test_growing_critical_batch_gives_doublings_in_order_at_the_crossings():
    crit = _power(64.0, 1.0)  # B_crit = 64 at 1000 samples, doubling with progress
    stages = plan_stages(crit, LADDER, 9000.0)
    batches = [LADDER[j] for j, _, _ in stages]
    assert batches == sorted(batches) and batches[-1] == 512
    for j, p, c in stages[1:]:  # each switch where the curve passes the new batch (first check past it)
        assert c >= LADDER[j] and p == pytest.approx(LADDER[j] / 64.0 * 1000.0, rel=0.03)


def test_rule_is_merrills_on_a_doubling_ladder():
    crit = np.array([10.0, 20.0, 40.0, 40.0, 100.0, 300.0, 300.0])
    at = np.arange(1.0, 8.0) * 1000
    mine = plan_stages(lambda p: np.interp(p, at, crit), LADDER, 7000.0)
    steps = merrill_batch_warmup(crit, 8.0, 1.0, at_tokens=at)
    theirs = [s.batch for s in steps if s.doubled]
    assert [LADDER[j] for j, _, _ in mine[1:]][: len(theirs)] == theirs[: len(mine) - 1]


def test_falling_critical_batch_is_a_fixed_batch():
    cmp = compare_schedule(_power(400.0, -0.2), _cands(), reference="P1xG8", end_progress=10000.0, tol=0.1)
    assert len(cmp.stages) == 1 and "no schedule" in cmp.verdict()


def test_schedule_beats_fixed_when_the_critical_batch_grows_and_steps_cost_time():
    crit = _power(16.0, 1.0)  # small early, 1280 at the end
    cmp = compare_schedule(
        crit, _cands(), reference="P1xG8", end_progress=80000.0, tol=0.1, last_measured_progress=20000.0
    )
    assert len(cmp.stages) > 3
    s = cmp.schedule
    assert s.samples <= 1.1 * 80000.0  # every stage within the critical batch: ratio <= 1 + tol
    assert all(s.time_s < f.time_s for f in cmp.fixed.values())
    assert cmp.time_ratio < 1.0 and cmp.winner == "schedule"
    assert s.samples == pytest.approx(cmp.stages[-1].end_samples)
    assert sum(st.steps for st in cmp.stages) == pytest.approx(s.steps, rel=1e-3)
    assert any("extrapolated" in n for n in cmp.notes)
    # a fixed batch far below the critical batch everywhere costs R(B0) samples
    flat = compare_schedule(_power(1e6, 0.0), _cands(), reference="P1xG8", end_progress=5000.0, tol=0.1)
    assert flat.fixed["P1xG8"].samples == pytest.approx(5000.0)
    assert flat.fixed["P64xG8"].samples == pytest.approx(5000.0, rel=1e-3)
