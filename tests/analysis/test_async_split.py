"""The rollout:train split of the user's cluster, modelled from one device's stage times
(analysis/decide/async_split.py): hand-computed cases."""

from __future__ import annotations

import math

import pytest

from batchtune.analysis.decide.async_rank import REstimate, StageTimes
from batchtune.analysis.decide.async_split import default_splits, fitted_scaling, rank_splits

# generation latency-bound (t ~ B^0.5), training linear in the batch (t ~ B)
TIMES = {16: StageTimes(1.0, 0.5, 0.0), 32: StageTimes(math.sqrt(2), 1.0, 0.0)}
LABELS = {(16, 0, 1): "P2xG8", (16, 1, 1): "P2xG8-k1u1"}


def test_default_splits_are_quarter_points() -> None:
    assert default_splits(8) == [2, 4, 6]
    assert default_splits(2) == [1]
    assert default_splits(1) == []


def test_scaling_is_fitted_over_the_measured_batches() -> None:
    a_gen, a_train = fitted_scaling(TIMES)
    assert a_gen == pytest.approx(0.5) and a_train == pytest.approx(1.0)
    assert fitted_scaling({16: TIMES[16]}) == (None, None)


def test_a_split_beats_colocated_when_generation_is_latency_bound() -> None:
    est = [REstimate(16, 0, 1, 1600, 1500, 1700), REstimate(16, 1, 1, 1600, 1500, 1700)]
    r = rank_splits(est, TIMES, LABELS, total_gpus=8)
    rows = {(row.label, row.choice.rollout_gpus): row for row in r.rows}
    # colocated on 8: gen 1 / 8^0.5 + train 0.5 / 8 per batch; 6:2: max(1 / 6^0.5, 0.5 / 2)
    sync = rows[("P2xG8", None)].choice
    assert sync.responses_per_s == pytest.approx(16 / (1 / math.sqrt(8) + 0.5 / 8))
    six = rows[("P2xG8-k1u1", 6)].choice
    assert six.responses_per_s == pytest.approx(16 / (1 / math.sqrt(6)), rel=1e-6)
    assert r.rows[0].label == "P2xG8-k1u1" and r.rows[0].choice.rollout_gpus == 6
    assert "rollout-bound" in rows[("P2xG8-k1u1", 2)].reason  # 2:6: the trainer waits
    assert "colocated" in rows[("P2xG8", None)].reason
    assert "modelled, not measured" in r.notes[0] and "g^0.50 (fitted" in r.notes[0]


def test_with_one_batch_scaling_is_linear_and_no_split_beats_colocated() -> None:
    one = {16: TIMES[16]}
    est = [REstimate(16, 0, 1, 1600, 1500, 1700), REstimate(16, 1, 1, 1600, 1500, 1700)]
    r = rank_splits(est, one, LABELS, total_gpus=8)
    assert r.rows[0].choice.rollout_gpus is None  # perfect data parallelism: colocated is as fast
    assert "one batch measured: assumed" in r.notes[0]


def test_a_cap_that_does_not_bind_is_the_bound_alone() -> None:
    # k = 1 keeps at most 2 batches in flight: a cap of 2 ties with the bound, so the row is the bound's
    # (queue "k", algorithm.in_flight_cap 0), as in the joint ranking, not "at most 1 queued"
    est = [REstimate(16, 0, 1, 1600, 1500, 1700), REstimate(16, 1, 1, 1600, 1500, 1700)]
    r = rank_splits(est, TIMES, LABELS, total_gpus=8, in_flight_caps=(2, 3, None))
    async_rows = [row.choice for row in r.rows if row.choice.mode == "async"]
    assert {c.rollout_gpus for c in async_rows} == {2, 4, 6}
    assert all(c.in_flight_cap is None for c in async_rows)
