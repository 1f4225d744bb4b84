"""check's decisions: robust properties on constructed evidence (no engine, no files)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from batchtune.analysis.decide.batch_check import TimeRanking, check_batch
from batchtune.analysis.decide.check import (
    FAIL,
    INSUFFICIENT,
    PASS,
    SKIPPED,
    WARN,
    CheckItem,
    CheckResult,
    check_concurrency,
    check_lr,
    check_time,
    interp_loglog,
)
from batchtune.analysis.sample.critical import CriticalBatch
from batchtune.analysis.sample.ratio import DEVIATES, INVARIANT, REFERENCE, Verdict
from batchtune.analysis.system.knee import Knee


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


def walkthrough():
    """tiny-grpo as the new-user walkthrough measured it: critical batch 32 (a measured batch), the
    1+tol crossing 38.68 with 90% CI [33.7542, 45.9976]; 64, 128 and 256 deviate (more samples), and
    P16xG8 (128) reaches the target soonest, P8xG8 and P32xG8 within its uncertainty."""
    verdicts = tuple(
        Verdict(float(b), s, None, "")
        for b, s in {16: REFERENCE, 32: INVARIANT, 64: DEVIATES, 128: DEVIATES, 256: DEVIATES}.items()
    )
    crit = CriticalBatch(
        batch=32.0,
        lower=32.0,
        upper=64.0,
        interpolated=38.68,
        verdicts=verdicts,
        tol=0.1,
        reason="constructed",
        reference_batch=16.0,
        fit=None,
        crossing=38.68,
        crossing_ci=(33.7542, 45.9976),
    )
    ranking = TimeRanking(
        batches=(16.0, 32.0, 64.0, 128.0, 256.0),
        times=(11.7, 7.32, 5.72, 5.16, 6.26),
        unit="s",
        pick_name="P16xG8",
        pick_batch=128.0,
        pick_time=5.16,
        tied=(64.0, 256.0),
    )
    return crit, ranking


W_BATCHES = [16.0, 32.0, 64.0, 128.0, 256.0]
W_RPS = [341.0, 567.0, 849.0, 1129.0, 1353.0]


def test_batch_the_recommendation_picked_passes_though_above_the_critical_batch():
    """`recommend --emit` wrote N = 128; check failed it ("above the critical batch 32 ... use at most
    32") although the same analysis ranked 128 fastest: the two commands gave opposite advice."""
    crit, ranking = walkthrough()
    it = check_batch(128, crit, W_BATCHES, W_RPS, 0.2, ranking)
    assert it.status == PASS
    assert "pick" in it.message and "above the critical batch 32" in it.message
    for n in (64, 256, 96, 192):  # within uncertainty of the pick, measured or between two such
        assert check_batch(n, crit, W_BATCHES, W_RPS, 0.2, ranking).status == PASS, n


def test_batch_slower_than_the_pick_warns_and_fails_only_with_more_samples():
    crit, ranking = walkthrough()
    below = check_batch(16, crit, W_BATCHES, W_RPS, 0.2, ranking)  # 11.7 / 5.16 = 2.27x, same samples
    assert below.status == WARN and "2.27x" in below.message and "consider 128" in below.message
    slow = TimeRanking(ranking.batches, (11.7, 7.32, 5.72, 5.16, 9.0), "s", "P16xG8", 128.0, 5.16, (64.0,))
    it = check_batch(256, crit, W_BATCHES, W_RPS, 0.2, slow)  # 1.74x the pick and clearly more samples
    assert it.status == FAIL and "use 128 (P16xG8)" in it.message
    beyond = check_batch(1024, crit, W_BATCHES, W_RPS, 0.2, ranking)  # nothing measured this far
    assert beyond.status == FAIL and "beyond the measured batches 16-256" in beyond.message
    assert "use 128 (P16xG8)" in beyond.message


def test_batch_messages_label_the_crossings_interval_and_round_it():
    crit, ranking = walkthrough()
    for it in (
        check_batch(128, crit, W_BATCHES, W_RPS, 0.2, ranking),
        check_batch(1024, crit, W_BATCHES, W_RPS, 0.2, ranking),
        check_batch(1024, crit, W_BATCHES, W_RPS, 0.2),
    ):
        text = it.expected + " " + it.message
        assert "1+tol crossing" in text and "[33.8, 46]" in text, text
        assert "33.7542" not in text and "45.9976" not in text


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


def test_concurrency_never_asks_for_more_in_flight_than_a_step_has():
    """The walkthrough: recommend set 128 in flight for 128-response steps, check warned ">= 512"."""
    knee = Knee(512.0, 0.1, (), None, "", True)
    it = check_concurrency(128, knee, 128)
    assert it.status == PASS and ">= 128" in it.expected
    low = check_concurrency(32, knee, 128)
    assert low.status == WARN and ">= 128" in low.expected and "512" not in low.message.split("(")[0]
    assert check_concurrency(256, knee, 1024).status == WARN  # a big step: the knee still applies


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


def test_a_measured_batch_between_two_tied_ones_is_judged_by_its_own_time():
    """128 measured at 1.6x the pick's time sat between the pick (64) and a batch tied with it (256),
    and passed as "within uncertainty"; only an unmeasured batch between two tied ones is tied."""
    crit, ranking = walkthrough()
    gap = TimeRanking(ranking.batches, (11.7, 7.32, 5.0, 8.0, 5.2), "s", "P8xG8", 64.0, 5.0, (256.0,))
    assert check_batch(128, crit, W_BATCHES, W_RPS, 0.2, gap).status != PASS
    assert not gap.is_tied(128.0)


def test_the_gate_reads_the_shape_free_interval_where_the_model_one_disagrees():
    """Issue 32: on the NQM (flat, then steep) the joint fit's crossing interval is narrow and misses
    the truth (431 here; 36% coverage on the NQM), the shape-free one covers 85-95%: check's gate
    reads the latter, so a batch inside it is not failed for being above the model's interval."""
    from batchtune.analysis.sample.intervals import ShapeFreeCrossing

    statuses = {8: REFERENCE, 64: INVARIANT, 256: INVARIANT, 512: DEVIATES}
    model_only = dataclasses.replace(
        critical(batch=256.0, ci=(250.0, 300.0), statuses=statuses),
        crossing=270.0,
        lower=256.0,
        reference_batch=8.0,
    )
    sf = ShapeFreeCrossing(381.0, (300.0, 490.0), (256.0, 512.0), 0.05, 12, 0.9, 8.0, 0.1, 284.0)
    both = dataclasses.replace(model_only, shape_free=sf)
    batches, rps = [8.0, 64.0, 256.0, 512.0], [5.0, 30.0, 80.0, 120.0]
    assert check_batch(384, model_only, batches, rps, 0.2).status == FAIL  # above the model's [250, 300]
    it = check_batch(384, both, batches, rps, 0.2)
    assert it.status == PASS, it.message
    assert "inside the 1+tol crossing's 90% shape-free interval [300, 490]" in it.message
    assert "270" not in it.message and "the 1+tol crossing 381" in it.expected  # one crossing, labelled
    assert check_batch(512, both, batches, rps, 0.2).status == FAIL  # the measured 512 deviates
    beyond = dataclasses.replace(both, verdicts=both.verdicts[:3])  # 512 not measured: the interval bounds
    assert check_batch(500, beyond, batches[:3], rps[:3], 0.2).status == FAIL
