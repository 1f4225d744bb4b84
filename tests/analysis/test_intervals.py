"""Intervals named for what they are (issue 32 item 3) and the crossing interval that holds without
the McCandlish model (item 2): analysis/sample/intervals.py."""

from __future__ import annotations

import numpy as np

from batchtune.analysis.sample.curves import GEOMETRIC_MEAN, TargetCrossing, estimate_over_seeds
from batchtune.analysis.sample.intervals import ci_header, interval_kind
from tests.analysis.test_recommend_evidence import _cand, _recommend


def _est(values, **kw):
    return estimate_over_seeds([TargetCrossing(v, False, 1e9) for v in values], **kw)


def test_three_seeds_median_interval_is_their_range_not_90_percent():
    est = _est([900.0, 1000.0, 1300.0])
    assert (est.ci_low, est.ci_high) == (900.0, 1300.0)  # the bootstrap percentile = min, max
    assert interval_kind(est) == "range of 3 seeds"
    assert interval_kind(est, (0.8, 1.3)) == "range of 3 seeds x the trunk's extrapolation interval"
    assert interval_kind(_est([1000.0])) == "one seed, no interval"
    geo = _est([900.0, 1000.0, 1300.0, 1100.0, 950.0], statistic=GEOMETRIC_MEAN)
    assert "bootstrap interval over 5 seeds" in interval_kind(geo)
    assert ci_header([est, None]) == "seed range" and ci_header([geo]) == "interval"


def test_the_full_run_prediction_names_its_interval():
    rec = _recommend([_cand(4, [1000.0, 1100.0, 1200.0]), _cand(8, [1050.0, 1150.0, 1250.0])])
    assert "range of 3 seeds" in rec.confirm and "90% CI" not in rec.confirm


def test_range_of_three_seeds_covers_a_new_run_half_the_time():
    """Why it is not called 90%: one new run (the user's full run) lands in [min, max] of 3 seeds
    with probability (n-1)/(n+1) = 0.5."""
    rng = np.random.default_rng(0)
    draws = rng.lognormal(0.0, 0.15, size=(4000, 4))
    inside = (draws[:, 3] >= draws[:, :3].min(axis=1)) & (draws[:, 3] <= draws[:, :3].max(axis=1))
    assert 0.47 < inside.mean() < 0.53
