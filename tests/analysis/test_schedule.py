"""Batch-size schedules from the measured local ratios of a branched probe (analysis/branched/schedule.py)."""

from __future__ import annotations

import math

import pytest

from batchtune.analysis.branched.schedule import ScheduleCandidate, Segment, compare_schedule
from batchtune.errors import AnalysisError

LADDER = [8, 16, 32, 64, 128, 256, 512]


def _cands(rate=lambda n: n / (1.0 + 0.01 * n)) -> list[ScheduleCandidate]:
    return [ScheduleCandidate(f"P{n // 8}xG8", n // 8, 8, 0.01 * n / 8, rate(n)) for n in LADDER]


def _mccandlish(b_noise: float) -> dict[float, float]:
    """Local ratios E(B)/E(B0) = (B_noise + B) / (B_noise + B0) at every batch of the ladder."""
    return {float(n): (b_noise + n) / (b_noise + 8.0) for n in LADDER}


def test_a_fixed_batch_is_the_weighted_mean_of_its_local_ratios():
    segs = [Segment(1000.0, {64.0: 1.2}, 40.0), Segment(3000.0, {64.0: 1.0, 128.0: 1.5}, 90.0)]
    cmp = compare_schedule(segs, _cands(), reference="P1xG8", tol=0.1)
    assert cmp.fixed["P1xG8"].samples == pytest.approx(4000.0)
    assert cmp.fixed["P8xG8"].samples == pytest.approx(1000 * 1.2 + 3000 * 1.0)
    # not branched at the first checkpoint: counted there at its mean where it was (the ranking's reading)
    assert cmp.fixed["P16xG8"].samples == pytest.approx(4000 * 1.5)
    assert cmp.fixed["P16xG8"].steps == pytest.approx(4000 * 1.5 / 128)
    assert "P32xG8" not in cmp.fixed  # never branched: not predicted
    assert cmp.fixed["P8xG8"].time_s == pytest.approx(4200.0 / _cands()[3].responses_per_s)


def test_a_growing_critical_batch_gives_a_warmup_that_beats_every_fixed_batch():
    segs = [Segment(2000.0, _mccandlish(b), b) for b in (8.0, 60.0, 400.0, 3000.0)]
    cmp = compare_schedule(segs, _cands(), reference="P1xG8", tol=0.1)
    batches = [st.batch_responses for st in cmp.stages]
    assert len(batches) >= 3 and batches == sorted(batches)
    assert cmp.winner == "schedule" and cmp.time_ratio < 0.9
    assert all(cmp.schedule.time_s < f.time_s for f in cmp.fixed.values())
    s = cmp.schedule
    assert s.samples == pytest.approx(cmp.stages[-1].end_samples)
    assert sum(st.steps for st in cmp.stages) == pytest.approx(s.steps)
    assert sum(st.time_s for st in cmp.stages) == pytest.approx(s.time_s)
    assert [st.start_progress for st in cmp.stages][0] == 0.0 and cmp.end_progress == pytest.approx(8000.0)


def test_a_steady_critical_batch_is_a_fixed_batch_the_same_as_the_best_fixed():
    segs = [Segment(2000.0, _mccandlish(200.0), 200.0) for _ in range(3)]
    cmp = compare_schedule(segs, _cands(), reference="P1xG8", tol=0.1)
    assert len(cmp.stages) == 1 and cmp.stages[0].label == cmp.best_fixed
    assert cmp.time_ratio == pytest.approx(1.0) and cmp.winner == cmp.best_fixed
    assert "no schedule" in cmp.verdict()


def test_a_gain_within_one_plus_tol_does_not_make_a_stage():
    # late in the run P16xG8 keeps up and is faster per unit of progress than P8xG8: by 5% it is
    # within the noise of the ratios (no switch), by 30% the schedule steps up to it
    thr = {n: float(n) for n in LADDER}
    cands = _cands(lambda n: thr[n])
    for gain, stages in ((1.05, ["P8xG8"]), (1.3, ["P8xG8", "P16xG8"])):
        r128 = 128 / 64 / gain  # its time per progress: r / thr = (1/64) / gain
        segs = [
            Segment(1000.0, {64.0: 1.0, 128.0: 3.0}, 70.0),
            Segment(9000.0, {64.0: 1.0, 128.0: r128}, 100.0),
        ]
        cmp = compare_schedule(segs, cands, reference="P1xG8", tol=0.1)
        assert [st.label for st in cmp.stages] == stages


def test_the_batch_never_falls():
    # P8xG8 is the recommendation; the last checkpoint reads P4xG8 much faster there (a noisy ratio
    # of P8xG8, or a critical batch that falls): a warmup does not step down, so no schedule
    thr = {n: float(n) for n in LADDER}
    segs = [Segment(2000.0, {32.0: 1.0, 64.0: 1.0}, 60.0), Segment(2000.0, {32.0: 1.0, 64.0: 1.6}, 30.0)]
    cmp = compare_schedule(segs, _cands(lambda n: thr[n]), reference="P1xG8", tol=0.1, incumbent="P8xG8")
    assert [st.label for st in cmp.stages] == ["P8xG8"] and "no schedule" in cmp.verdict()


def test_bad_segments_are_refused():
    with pytest.raises(AnalysisError, match="segments"):
        compare_schedule([], _cands(), reference="P1xG8", tol=0.1)
    with pytest.raises(AnalysisError, match="reference"):
        compare_schedule([Segment(1.0, {}, 8.0)], _cands(), reference="P3xG8", tol=0.1)
    inf = [Segment(100.0, {64.0: math.inf}, 8.0)]
    assert "P8xG8" not in [compare_schedule(inf, _cands(), reference="P1xG8", tol=0.1).best_fixed]


def test_the_schedule_starts_from_the_recommendation_when_given():
    # two fixed batches within a hair of each other: the schedule keeps the ranking's pick
    thr = {n: float(n) for n in LADDER}
    segs = [Segment(5000.0, {64.0: 1.0, 128.0: 2.0 * 1.001}, 100.0)]
    cands = _cands(lambda n: thr[n])
    assert compare_schedule(segs, cands, reference="P1xG8", tol=0.1).best_fixed == "P8xG8"
    cmp = compare_schedule(segs, cands, reference="P1xG8", tol=0.1, incumbent="P16xG8")
    assert cmp.best_fixed == "P16xG8" and [st.label for st in cmp.stages] == ["P16xG8"]
    assert cmp.time_ratio == pytest.approx(1.0)
