"""Does the pick survive the throughput's own noise (analysis/decide/throughput_noise.py)?"""

from __future__ import annotations

import math

import pytest

from batchtune.analysis.decide.ranking import rank_time_to_target
from batchtune.analysis.decide.throughput_noise import pick_under_noise, point_spread, step_spread
from batchtune.records.types import ThroughputPoint

TIE = 0.03


def _ranking(thr: list[float]):
    """Three batches at the same R interval shape: only their throughput decides."""
    r = [1000.0, 1100.0, 1500.0]
    return rank_time_to_target(
        ["P2xG8", "P4xG8", "P8xG8"],
        [16, 32, 64],
        r,
        [x * 0.9 for x in r],
        [x * 1.1 for x in r],
        thr,
        reference="P2xG8",
        tie_margin=TIE,
    )


def test_a_near_tie_is_called_within_noise_and_a_clear_pick_holds() -> None:
    # P8xG8 is 5% faster than P4xG8 by expected time: past the 3% tie margin, so it wins; with
    # each throughput within +-6% of its measurement P4xG8 wins a large share of draws
    near = _ranking([10.0, 20.0, 28.7])
    assert near.winner == "P8xG8"
    check = pick_under_noise(near, {"P2xG8": 0.06, "P4xG8": 0.06, "P8xG8": 0.06}, TIE)
    assert check is not None and check.within_noise
    assert 0.2 < check.holds < 0.95 and set(check.rivals) <= {"P2xG8", "P4xG8", "P8xG8"}
    assert "within throughput noise" in check.text() and "stated rule" in check.text()
    clear = _ranking([10.0, 20.0, 40.0])  # P8xG8 ~1.36x faster than P4xG8
    sure = pick_under_noise(clear, {"P2xG8": 0.03, "P4xG8": 0.03, "P8xG8": 0.03}, TIE)
    assert sure is not None and sure.holds == 1.0 and not sure.within_noise and sure.rivals == {}
    assert sure.text().startswith("Throughput noise: the pick P8xG8 holds in 100%")


def test_no_noise_is_the_ranking_itself_and_no_spread_is_no_check() -> None:
    for thr in ([10.0, 20.0, 28.7], [10.0, 20.0, 40.0], [10.0, 11.0, 12.0]):
        ranking = _ranking(thr)
        zero = pick_under_noise(ranking, {"P2xG8": 0.0, "P4xG8": 0.0, "P8xG8": 0.0}, TIE)
        assert zero is not None and zero.holds == 1.0  # the winner rule is the ranking's own
    assert pick_under_noise(_ranking([10.0, 20.0, 40.0]), {"P2xG8": math.nan}, TIE) is None
    part = pick_under_noise(_ranking([10.0, 20.0, 28.7]), {"P2xG8": 0.04, "P4xG8": math.nan}, TIE)
    assert part is not None and part.spreads["P4xG8"] == pytest.approx(0.04)  # the median of the known


def test_a_censored_candidate_never_wins_a_draw() -> None:
    ranking = rank_time_to_target(
        ["A", "B"], [16, 32], [1000.0, math.inf], [900.0, 800.0], [1100.0, math.inf], [10.0, 40.0],
        reference="A", tie_margin=TIE,
    )  # fmt: skip
    check = pick_under_noise(ranking, {"A": 0.5, "B": 0.5}, TIE)
    assert check is not None and check.holds == 1.0


def test_spreads_come_from_the_profile_points_repeats() -> None:
    def point(c: int, s: float, spread: float, repeats: int) -> ThroughputPoint:
        return ThroughputPoint(
            "generation", "simulated", "eos", concurrency=c, step_latency_s=s,
            step_latency_spread_s=spread, repeats=repeats,
        )  # fmt: skip

    pts = [point(8, 1.0, 0.05, 3), point(64, 2.0, 0.2, 3), point(512, 4.0, 0.0, 1)]
    assert point_spread(pts, 10) == pytest.approx(0.05)
    assert point_spread(pts, 50) == pytest.approx(0.1)
    assert math.isnan(point_spread(pts, 600))  # one repeat: not measured
    assert step_spread(1.0, 0.05, 3.0, 0.1, 0.0) == pytest.approx(0.0875)
