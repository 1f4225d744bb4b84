"""check's decisions: robust properties on constructed evidence (no engine, no files)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchtune.analysis.check import (
    FAIL,
    INSUFFICIENT,
    PASS,
    SKIPPED,
    WARN,
    CheckItem,
    CheckResult,
    check_batch,
    check_concurrency,
    check_lr,
    check_time,
    interp_loglog,
)
from batchtune.analysis.critical import CriticalBatch
from batchtune.analysis.ratio import DEVIATES, INVARIANT, REFERENCE, Verdict
from batchtune.analysis.throughput import Knee


def critical(batch=256.0, ci=(200.0, 400.0), statuses=None):
    statuses = statuses or {64: REFERENCE, 128: INVARIANT, 256: INVARIANT, 512: DEVIATES}
    verdicts = tuple(Verdict(float(b), s, None, "") for b, s in statuses.items())
    return CriticalBatch(
        batch=batch,
        lower=128.0,
        upper=512.0,
        interpolated=None,
        verdicts=verdicts,
        tol=0.1,
        reason="constructed",
        reference_batch=64.0,
        fit=None,
        crossing_ci=ci,
        walk_batch=256.0,
    )


BATCHES = [64.0, 128.0, 256.0, 512.0]
RPS = [10.0, 18.0, 30.0, 40.0]


def test_batch_above_interval_or_a_deviating_batch_fails():
    assert check_batch(800, critical(), BATCHES, RPS, 0.2).status == FAIL
    assert check_batch(512, critical(ci=(200.0, math.inf)), BATCHES, RPS, 0.2).status == FAIL  # measured
    assert check_batch(300, critical(), BATCHES, RPS, 0.2).status == PASS
    assert check_batch(256, critical(), BATCHES, RPS, 0.2).status == PASS


def test_batch_unbounded_above_the_evidence_is_insufficient():
    c = critical(ci=(200.0, math.inf), statuses={64: REFERENCE, 128: INVARIANT, 256: INVARIANT})
    assert check_batch(384, c, BATCHES[:3], RPS[:3], 0.2).status == INSUFFICIENT
    assert (
        check_batch(
            1.0, CriticalBatch(None, None, None, None, (), 0.1, "R0 = inf", 64.0, None), [], [], 0.2
        ).status
        == INSUFFICIENT
    )


def test_batch_below_warns_only_when_throughput_is_given_up():
    it = check_batch(64, critical(), BATCHES, RPS, 0.2)  # 30/10 = 3x less throughput
    assert it.status == WARN and "3.00x" in it.message
    assert check_batch(128, critical(), BATCHES, [28.0, 28.0, 30.0, 31.0], 0.2).status == PASS
    assert check_batch(32, critical(), [], [], 0.2).status == WARN  # below the interval, no throughput


def test_interp_loglog_recovers_a_power_law_and_never_extrapolates():
    rng = np.random.default_rng(0)
    xs = np.sort(rng.uniform(10, 1000, size=6))
    ys = 3.0 * xs**0.6
    for x in rng.uniform(xs.min(), xs.max(), size=20):
        assert interp_loglog(float(x), xs, ys) == pytest.approx(3.0 * x**0.6, rel=1e-9)
    assert interp_loglog(float(xs[2]), xs, ys) == pytest.approx(ys[2])
    assert interp_loglog(float(xs.max() * 1.01), xs, ys) is None
    assert interp_loglog(5.0, [1.0, 10.0], [1.0, math.inf]) is None


@pytest.mark.parametrize(
    ("lr", "status"), [(2e-4, PASS), (2.3e-4, PASS), (4e-4, FAIL), (1e-4, FAIL), (None, SKIPPED)]
)
def test_lr_against_the_sqrt_rule(lr, status):
    # reference 1e-4 at 64 responses; sqrt rule at 256: 2e-4
    it = check_lr(lr, 256, 1e-4, 64, "sqrt", 0.25)
    assert it.status == status
    if status == FAIL:
        assert "set lr = 0.0002" in it.message
    assert check_lr(1e-4, 256, math.nan, 64, "sqrt", 0.25).status == INSUFFICIENT


def test_concurrency_knee_and_ceiling():
    knee = Knee(
        concurrency=64,
        threshold=0.1,
        gains_per_doubling=(),
        from_fit=None,
        reason="",
        saturated=True,
        ceiling=512,
    )
    assert check_concurrency(32, knee).status == WARN
    assert check_concurrency(128, knee).status == PASS
    assert check_concurrency(512, knee).status == FAIL
    assert check_concurrency(128, None).status == SKIPPED
    assert check_concurrency(None, knee).status == SKIPPED


def test_time_against_baseline():
    assert check_time(105.0, "s", 100.0, "s", 0.1).status == PASS
    assert check_time(120.0, "s", 100.0, "s", 0.1).status == FAIL
    assert check_time(None, "s", 100.0, "s", 0.1, "outside").status == INSUFFICIENT
    assert check_time(1.0, "x reference", 100.0, "s", 0.1).status == INSUFFICIENT
    assert check_time(1.0, "s", None, None, 0.1).status == SKIPPED


def test_exit_code_priority():
    def res(*statuses):
        return CheckResult(tuple(CheckItem("x", s, "", "", "", "batch") for s in statuses), None, "s")

    assert res(PASS, WARN, SKIPPED).exit_code == 0
    assert res(PASS, INSUFFICIENT).exit_code == 3
    assert res(FAIL, INSUFFICIENT).exit_code == 1
    assert res(WARN).status == WARN
