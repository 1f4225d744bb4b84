"""The pipeline time model (batchtune/analysis/system/pipeline.py): hand-computed cases, and the
discrete-event simulation against the closed forms where both apply."""

from __future__ import annotations

import math

import pytest

from batchtune.analysis.system.pipeline import (
    closed_form_time,
    min_staleness_bound,
    predict_pipeline,
    simulate_pipeline,
    split_times,
)
from batchtune.analysis.system.shared_device import C_MAX, fit_contention, shared_device
from batchtune.errors import AnalysisError

GEN_BOUND = dict(gen_time_s=10.0, train_time_s=4.0, sync_time_s=1.0)  # rollout is the slow side
TRAIN_BOUND = dict(gen_time_s=3.0, train_time_s=8.0, sync_time_s=1.0)  # trainer is the slow side


def test_sync_by_hand() -> None:
    e = predict_pipeline("sync", batch_responses=64, **GEN_BOUND)
    assert e.batch_time_s == e.step_time_s == 15.0  # 10 + 4 + 1
    assert e.responses_per_s == pytest.approx(64 / 15)
    assert e.rollout_idle_frac == pytest.approx(4 / 15)  # idle while training
    assert e.trainer_idle_frac == pytest.approx(10 / 15)  # idle while generating
    assert e.mean_staleness == 0.0


def test_one_step_off_by_hand() -> None:
    e = predict_pipeline("one_step_off", batch_responses=64, **GEN_BOUND)
    assert e.batch_time_s == 11.0  # max(10, 4) + 1
    assert e.trainer_idle_frac == pytest.approx(6 / 11) and e.rollout_idle_frac == 0.0
    assert e.mean_staleness == 1.0
    e2 = predict_pipeline("one_step_off", batch_responses=64, updates_per_batch=2, **TRAIN_BOUND)
    assert e2.batch_time_s == 9.0 and e2.step_time_s == 4.5  # max(3, 8) + 1, two updates
    assert e2.mean_staleness == 2.5  # lags 2 and 3


def test_sync_with_reuse_has_in_batch_lag() -> None:
    e = predict_pipeline("sync", batch_responses=8, updates_per_batch=4, **GEN_BOUND)
    assert e.step_time_s == 15.0 / 4 and e.mean_staleness == 1.5  # lags 0, 1, 2, 3


@pytest.mark.parametrize("times", [GEN_BOUND, TRAIN_BOUND])
@pytest.mark.parametrize("u", [1, 2, 3])
def test_simulation_meets_closed_forms(times: dict[str, float], u: int) -> None:
    sync = simulate_pipeline(
        batch_responses=16, staleness_bound=0, sync_every=u, updates_per_batch=u, **times
    )
    assert sync.batch_time_s == pytest.approx(closed_form_time("sync", **times))
    assert sync.mean_staleness == pytest.approx((u - 1) / 2)
    off = simulate_pipeline(
        batch_responses=16, staleness_bound=u, in_flight_cap=1, sync_every=u, updates_per_batch=u, **times
    )
    assert off.batch_time_s == pytest.approx(closed_form_time("one_step_off", **times))
    assert off.mean_staleness == pytest.approx(u + (u - 1) / 2)
    for s in (1, 2, 4):
        free = simulate_pipeline(
            batch_responses=16,
            staleness_bound=10**6,
            in_flight_cap=4,
            sync_every=s,
            updates_per_batch=u,
            **times,
        )
        want = closed_form_time("async", sync_every=s, updates_per_batch=u, **times)
        assert free.batch_time_s == pytest.approx(want, rel=1e-9)


def test_staleness_reached_by_hand() -> None:
    # Trainer-bound, cap 3 batches: the rollout starts batch b+3 as the trainer takes b, with the
    # weights of b updates, so every batch is 3 updates stale and the trainer never waits.
    e = simulate_pipeline(batch_responses=16, staleness_bound=None, in_flight_cap=3, **TRAIN_BOUND)
    assert e.mean_staleness == pytest.approx(3.0) and e.trainer_idle_frac == pytest.approx(0.0)
    assert e.batch_time_s == pytest.approx(9.0)
    # Rollout-bound: the trainer waits on every batch, so the lag stays 1 whatever the bound.
    for k in (1, 5, 50):
        g = simulate_pipeline(batch_responses=16, staleness_bound=k, **GEN_BOUND)
        assert g.mean_staleness == pytest.approx(1.0) and g.batch_time_s == pytest.approx(11.0)
    # Trainer-bound with a staleness bound and no cap: the rollout runs ahead up to the bound.
    t = simulate_pipeline(batch_responses=16, staleness_bound=6, **TRAIN_BOUND)
    assert t.mean_staleness == pytest.approx(6.0) and t.batch_time_s == pytest.approx(9.0)


def test_a_binding_bound_costs_time() -> None:
    # Equal sides with a sync: bound 0 serialises (sync), a larger cap overlaps.
    times = dict(gen_time_s=5.0, train_time_s=5.0, sync_time_s=0.5)
    slow = simulate_pipeline(batch_responses=8, staleness_bound=0, **times).batch_time_s
    fast = simulate_pipeline(batch_responses=8, staleness_bound=2, **times).batch_time_s
    assert slow == pytest.approx(10.5) and fast == pytest.approx(5.5)


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(AnalysisError, match="deadlocks"):
        simulate_pipeline(batch_responses=8, staleness_bound=0, sync_every=2, **GEN_BOUND)
    assert min_staleness_bound(4, 2) == 2 and min_staleness_bound(3, 3) == 0
    with pytest.raises(AnalysisError, match="unknown pipeline mode"):
        predict_pipeline("ring", batch_responses=8, **GEN_BOUND)
    with pytest.raises(AnalysisError, match="gen_time_s"):
        predict_pipeline("sync", batch_responses=8, gen_time_s=math.nan, train_time_s=1, sync_time_s=0)
    with pytest.raises(AnalysisError, match="staleness_bound or an in_flight_cap"):
        predict_pipeline("async", batch_responses=8, staleness_bound=None, **GEN_BOUND)


def test_split_times() -> None:
    assert split_times(gen_time_all_s=10, train_time_all_s=6, total_gpus=8, rollout_gpus=4) == (20.0, 12.0)
    g, t = split_times(gen_time_all_s=10, train_time_all_s=6, total_gpus=8, rollout_gpus=2, gen_scaling=0)
    assert (g, t) == (10.0, pytest.approx(8.0))
    with pytest.raises(AnalysisError):
        split_times(gen_time_all_s=1, train_time_all_s=1, total_gpus=2, rollout_gpus=2)


def test_sync_that_costs_the_trainer_only() -> None:
    # Rollout-bound, bound not binding: a sync that pauses the rollout too adds to its time;
    # one that costs only the trainer (it sends, the rollout's load is in gen) does not.
    both = simulate_pipeline(batch_responses=16, staleness_bound=50, in_flight_cap=4, **GEN_BOUND)
    trainer = simulate_pipeline(
        batch_responses=16, staleness_bound=50, in_flight_cap=4, sync_pauses_rollout=False, **GEN_BOUND
    )
    assert both.batch_time_s == pytest.approx(11.0) and trainer.batch_time_s == pytest.approx(10.0)


def test_handoff_latency_by_hand() -> None:
    # Strict alternation (bound 0): each batch crosses to the trainer and each sync back, so two
    # handoffs per batch; a pipeline that runs ahead hides them.
    kw = dict(batch_responses=8, sync_pauses_rollout=False, **GEN_BOUND)
    serial = simulate_pipeline(staleness_bound=0, handoff_s=0.25, **kw)  # type: ignore[arg-type]
    assert serial.batch_time_s == pytest.approx(10 + 4 + 1 + 0.5)
    ahead = simulate_pipeline(staleness_bound=3, in_flight_cap=3, handoff_s=0.25, **kw)  # type: ignore[arg-type]
    assert ahead.batch_time_s == pytest.approx(10.0)
    with pytest.raises(AnalysisError, match="handoff_s"):
        simulate_pipeline(staleness_bound=0, handoff_s=-1.0, **kw)  # type: ignore[arg-type]


def test_overlap_shares() -> None:
    # Rollout-bound with a cap: the trainer (4 of every 10 s) is always busy alongside the rollout.
    e = simulate_pipeline(
        batch_responses=8, staleness_bound=5, in_flight_cap=3, sync_pauses_rollout=False, **GEN_BOUND
    )
    assert e.trainer_overlap_frac == pytest.approx(1.0)
    assert e.rollout_overlap_frac == pytest.approx(5 / 10)  # train 4 + sync 1 per 10 s of generation
    serial = simulate_pipeline(batch_responses=8, staleness_bound=0, sync_pauses_rollout=False, **GEN_BOUND)
    assert serial.rollout_overlap_frac == 0.0 and serial.trainer_overlap_frac == 0.0


def test_shared_device_contention() -> None:
    kw = dict(
        batch_responses=8, sync_time_s=1.0, staleness_bound=5, in_flight_cap=3, sync_pauses_rollout=False
    )
    free = shared_device(contention=1.0, gen_time_s=10.0, train_time_s=4.0, **kw)  # type: ignore[arg-type]
    assert free.batch_time_s == pytest.approx(10.0)
    # c = 2 on both: the rollout runs at half speed while the trainer is busy; the fixed point
    # meets the defining relation time = time alone / (1 - f (1 - 1 / c))
    slow = shared_device(contention=2.0, gen_time_s=10.0, train_time_s=4.0, **kw)  # type: ignore[arg-type]
    assert slow.batch_time_s > free.batch_time_s
    assert slow.batch_time_s == pytest.approx(10.0 / (1 - slow.rollout_overlap_frac * 0.5), rel=1e-4)
    worse = shared_device(contention=3.0, gen_time_s=10.0, train_time_s=4.0, **kw)  # type: ignore[arg-type]
    assert worse.batch_time_s > slow.batch_time_s
    # strict alternation never overlaps: contention changes nothing
    alt = dict(kw, staleness_bound=0, in_flight_cap=None)
    a1 = shared_device(contention=1.0, gen_time_s=10.0, train_time_s=4.0, **alt)  # type: ignore[arg-type]
    a3 = shared_device(contention=3.0, gen_time_s=10.0, train_time_s=4.0, **alt)  # type: ignore[arg-type]
    assert a1.batch_time_s == pytest.approx(15.0) and a3.batch_time_s == pytest.approx(15.0)
    with pytest.raises(AnalysisError, match="contention"):
        shared_device(contention=0.5, gen_time_s=10.0, train_time_s=4.0, **kw)  # type: ignore[arg-type]


def test_a_trace_of_varying_times() -> None:
    # A constant trace is the constant case; alternating slow and fast batches with the same mean
    # cost time when the bound stops the rollout running ahead (bound 0), not with room ahead.
    kw = dict(batch_responses=8, train_time_s=4.0, sync_time_s=1.0, sync_pauses_rollout=False)
    flat = simulate_pipeline(gen_time_s=10.0, staleness_bound=1, in_flight_cap=1, **kw)  # type: ignore[arg-type]
    same = simulate_pipeline(
        gen_time_s=10.0,
        staleness_bound=1,
        in_flight_cap=1,
        gen_trace=[10.0],
        **kw,  # type: ignore[arg-type]
    )
    assert same.batch_time_s == pytest.approx(flat.batch_time_s)
    varied = dict(kw, gen_time_s=4.5, gen_trace=[1.0, 8.0])
    tight = simulate_pipeline(staleness_bound=1, in_flight_cap=1, **varied)  # type: ignore[arg-type]
    loose = simulate_pipeline(staleness_bound=8, in_flight_cap=8, **varied)  # type: ignore[arg-type]
    assert loose.batch_time_s == pytest.approx(5.0)  # the trainer's 4 + 1 bounds it on average
    assert tight.batch_time_s > loose.batch_time_s
    with pytest.raises(AnalysisError, match="gen_trace"):
        simulate_pipeline(staleness_bound=1, **dict(varied, gen_trace=[math.nan]))  # type: ignore[arg-type]


def test_fit_contention_by_hand_and_back() -> None:
    # a one-step-off pair run (bound 1, cap 2) measured at gen 1.5 s and train 0.9 s per batch against
    # 1.0 and 0.6 alone, sync 0.1 s: the rollout never stops (1.5 s a batch), the trainer is busy
    # 1.0 s of each 1.5 (f = 2/3) and the rollout busy all of the trainer's time (f = 1), so
    # 1.5 = 1.0 / (1 - 2/3 (1 - 1/c)) gives c = 2 and 0.9 = 0.6 / (1 - (1 - 1/c)) gives c = 1.5
    kw = dict(batch_responses=8, staleness_bound=1, in_flight_cap=2, sync_pauses_rollout=False)
    c = fit_contention(alone=(1.0, 0.6), overlapped=(1.5, 0.9), sync_time_s=0.1, **kw)  # type: ignore[arg-type]
    assert c == pytest.approx((2.0, 1.5))
    back = shared_device(contention=c, gen_time_s=1.0, train_time_s=0.6, sync_time_s=0.1, **kw)  # type: ignore[arg-type]
    assert back.batch_time_s == pytest.approx(1.5, rel=1e-4)  # the fitted factors reproduce the run
    # no slower than alone, or never overlapped (strict alternation): 1; beyond what overlap explains: the cap
    assert fit_contention(alone=(1.0, 0.6), overlapped=(0.9, 0.6), sync_time_s=0.1, **kw) == (1.0, 1.0)  # type: ignore[arg-type]
    alt = dict(kw, staleness_bound=0)
    assert fit_contention(alone=(1.0, 0.6), overlapped=(2.0, 1.2), sync_time_s=0.1, **alt) == (1.0, 1.0)  # type: ignore[arg-type]
    assert fit_contention(alone=(1.0, 0.6), overlapped=(50.0, 0.6), sync_time_s=0.1, **kw)[0] == C_MAX  # type: ignore[arg-type]
    with pytest.raises(AnalysisError, match="busy times"):
        fit_contention(alone=(0.0, 0.6), overlapped=(1.0, 0.6), sync_time_s=0.1, **kw)  # type: ignore[arg-type]
