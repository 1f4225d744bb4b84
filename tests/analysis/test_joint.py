"""Joint R(B) fit, paired ratio intervals and the isotonic estimator: recovery and coverage."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from batchtune.analysis.sample.critical import critical_batch
from batchtune.analysis.sample.curves import TargetCrossing
from batchtune.analysis.sample.joint import fit_joint
from batchtune.analysis.sample.monotone import isotonic_increasing, noise_sd
from batchtune.analysis.sample.ratio import ratio_to_reference
from batchtune.analysis.sample.seeds import estimate_over_seeds
from batchtune.errors import AnalysisError

ROOT = Path(__file__).resolve().parents[2]


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the file executes
    spec.loader.exec_module(mod)
    return mod


def _est(values, ids=(0, 1, 2)):
    return estimate_over_seeds([TargetCrossing(float(v), False, 1e12) for v in values], seed_ids=ids)


def test_isotonic_is_the_least_squares_monotone_fit():
    y = np.array([1.0, 3.0, 2.0, 4.0, 0.0, 5.0])
    fit = isotonic_increasing(y)
    np.testing.assert_allclose(fit, [1.0, 2.25, 2.25, 2.25, 2.25, 5.0])
    assert np.all(np.diff(fit) >= 0) and fit.sum() == pytest.approx(y.sum())
    rng = np.random.default_rng(0)
    assert noise_sd(np.linspace(0, 1, 2000) + rng.normal(0, 0.1, 2000)) == pytest.approx(0.1, rel=0.1)


def test_joint_fit_recovers_b_crit_and_reports_its_quality():
    rng = np.random.default_rng(3)
    batches = 32.0 * 2.0 ** np.arange(7)
    b, r, s = [], [], []
    seed_effect = rng.normal(0, 0.2, 3)
    for k in range(3):
        for x in batches:
            b.append(x), s.append(k)
            r.append(1000 * (1 + x / 300.0) * math.exp(seed_effect[k] + rng.normal(0, 0.03)))
    fit = fit_joint(b, r, s)
    assert fit.paired and fit.chosen == "mccandlish" and fit.dof == 21 - 3 - 1
    m = fit.mccandlish
    assert m.b_crit == pytest.approx(300.0, rel=0.15)
    assert m.b_crit_ci[0] <= m.b_crit <= m.b_crit_ci[1] and m.crossing_ci[0] <= m.crossing <= m.crossing_ci[1]
    assert m.crossing == pytest.approx(32 * 1.1 + 0.1 * m.b_crit)
    assert 0.01 < m.residual_rms_log < 0.05  # the seed effects are removed, the 3% noise is left
    assert "residual rms" in fit.describe() and "paired" in fit.describe()
    # Unpaired, the 20% seed effects stay in the residual.
    assert fit_joint(b, r).mccandlish.residual_rms_log > m.residual_rms_log
    with pytest.raises(AnalysisError):
        fit_joint([32.0, 64.0], [1.0, 2.0])  # no degree of freedom left


def test_flat_r_gives_an_unbounded_crossing():
    rng = np.random.default_rng(5)
    batches = np.repeat(32.0 * 2.0 ** np.arange(5), 3)
    fit = fit_joint(batches, 1000 * np.exp(rng.normal(0, 0.02, batches.size)), np.tile([0, 1, 2], 5))
    assert math.isinf(fit.mccandlish.crossing_ci[1])


def test_paired_ratio_interval_covers_at_its_nominal_rate():
    """3 paired seeds, 20% shared seed spread, 5% run noise, true ratio 1.2: the t interval on
    paired log ratios covers ~90%; the former unpaired median bootstrap did not."""
    rng = np.random.default_rng(7)
    hits, n = 0, 400
    for t in range(n):
        u = rng.normal(0, 0.2, 3)
        ref = _est(1000 * np.exp(u + rng.normal(0, 0.05, 3)))
        cand = _est(1200 * np.exp(u + rng.normal(0, 0.05, 3)))
        r = ratio_to_reference(ref, cand, seed=t)
        hits += r.ci_low <= 1.2 <= r.ci_high
    assert 0.85 <= hits / n <= 0.95


def test_failed_batches_bound_the_critical_batch_from_above():
    batches = [32.0, 64.0, 128.0, 256.0, 512.0]
    rng = np.random.default_rng(2)
    est = [_est(1000 * (1 + b / 1e5) * np.exp(rng.normal(0, 0.02, 3))) for b in batches[:-1]]
    never = estimate_over_seeds([TargetCrossing(None, True, 5e3)] * 3, seed_ids=(0, 1, 2))
    cb = critical_batch(batches, [*est, never])
    assert cb.failed_from == 512.0 and cb.batch == 256.0 and cb.upper == 512.0
    assert "below it" in cb.reason
    cb2 = critical_batch(batches[:-1], est, failed_batches=[256.0])
    assert cb2.failed_from == 256.0 and cb2.batch == 128.0


@pytest.mark.slow  # 13 s at load 4; the full benchmark's output is committed
def test_coverage_benchmark_reduced():
    """benchmarks/coverage_critical.py on 3 of its cases, 60 repetitions (the full run, 12 cases x
    200, is committed in benchmarks/out/coverage_critical.txt; B_crit 2048, where 1 repetition in
    100 lands two grid steps off, is left to it): every estimate within one grid step, B_crit within
    15% in median, 90% intervals covering in [0.75, 0.99] (binomial noise of 60 draws: 3.9%)."""
    bench = _bench("coverage_critical")
    res = bench.run_all(60, 0, b_crits=(64.0, 512.0), group_sizes=(8,)) + bench.run_all(
        60, 1, b_crits=(256.0,), group_sizes=(16,)
    )
    for c in res:
        assert c.within_one_step == 1.0, c
        assert abs(math.log(c.b_crit_median_ratio)) < 0.15, c
        assert 0.75 <= c.b_crit_coverage <= 0.99, c
        assert 0.75 <= c.crossing_coverage <= 0.99, c
        assert c.exact >= 0.7, c  # 2048: the true crossing (240) is 7% below the grid batch 256
