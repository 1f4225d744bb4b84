"""Near-ties go to the smaller batch: a few % of throughput noise cannot flip the pick."""

from __future__ import annotations

import pytest

from batchtune.analysis.decide.ranking import rank_time_to_target


def _rank(thr_large: float, margin: float):
    # equal samples-to-target, symmetric intervals: expected time = median time
    return rank_time_to_target(
        ["P2", "P4", "P8"],
        [16, 32, 64],
        [1000, 1000, 1000],
        [900, 900, 900],
        [1100, 1100, 1100],
        [10.0, 20.0, thr_large],
        reference="P2",
        tie_margin=margin,
    )


@pytest.mark.parametrize("thr_large", [19.5, 20.3, 20.5])  # P8 1-3% faster or slower than P4
def test_a_near_tie_picks_the_smaller_batch_whichever_way_the_noise_falls(thr_large):
    ranking = _rank(thr_large, 0.03)
    assert ranking.winner == "P4"
    if thr_large > 20.0:  # P8 was the faster one: the reason says the rule decided
        assert "tie margin" in ranking.reason and "P8" in ranking.reason


def test_without_the_margin_the_faster_one_wins_and_outside_it_too():
    assert _rank(20.3, 0.0).winner == "P8"
    assert _rank(22.0, 0.03).winner == "P8"  # 9% faster: not a near-tie
    r = _rank(22.0, 0.03)
    p8, p2 = r.by_name("P8"), r.by_name("P2")
    assert r.expected_ratio(p8) == pytest.approx(p8.expected_time_s / p2.time_to_target_s)


def test_the_rank_column_is_monotone_outside_the_near_tie_set():
    r = _rank(20.3, 0.03)
    ratios = [r.expected_ratio(c) for c in r.candidates]
    assert [c.name for c in r.candidates] == ["P4", "P8", "P2"]
    assert ratios[2] > max(ratios[:2]) * 1.03
