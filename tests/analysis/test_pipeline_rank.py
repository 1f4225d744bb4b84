"""The joint async ranking (batchtune/analysis/decide/async_rank.py): hand-computed cases."""

from __future__ import annotations

import math

import pytest

from batchtune.analysis.decide.async_rank import REstimate, StageTimes, async_verdict, rank_async
from batchtune.analysis.system.pipeline import simulate_pipeline
from batchtune.errors import AnalysisError

TIMES = {64: StageTimes(gen_time_s=10.0, train_update_s=4.0, sync_time_s=1.0)}


def test_sync_and_async_by_hand() -> None:
    # sync: 10 + 4 + 1 = 15 s per 64 responses; async on one device (two processes), k = 1: 11 s.
    est = [REstimate(64, 0, 1, 6400, 6000, 7000), REstimate(64, 1, 1, 7040, 6400, 8400)]
    ranked = rank_async(est, TIMES)
    assert [r.mode for r in ranked] == ["async", "sync"]
    a, s = ranked
    assert s.t == pytest.approx(6400 / (64 / 15)) and s.t_lo == pytest.approx(6000 / (64 / 15))
    assert a.t == pytest.approx(7040 / (64 / 11)) and a.lag_reached == pytest.approx(1.0)
    lines = async_verdict(ranked)
    assert "throughput x1.364" in lines[2] and "samples-to-target x1.100" in lines[2]
    assert "not decided" in lines[-1]  # 1210 [1100, 1444] vs 1500 [1406, 1641]: overlap


def test_the_verdict_names_split_and_queue_as_the_table_does() -> None:
    # the joint table's words (report/joint.py: split "shared" / "6:2", queue "k" / a number), not the
    # model's fields (split=1, cap=None)
    est = [REstimate(64, 0, 1, 6400, 6000, 7000), REstimate(64, 1, 1, 7040, 6400, 8400)]
    best = async_verdict(rank_async(est, TIMES))[1]
    assert best.startswith("best async: B=64 k=1 u=1, split shared, queue k (the staleness bound alone): T=")
    assert "None" not in best and "split=" not in best and "cap=" not in best
    capped = rank_async([REstimate(64, 0, 1, 6400, 6000, 7000), REstimate(64, 3, 1, 7040, 6400, 8400)],
                        TIMES, total_gpus=8, splits=[6], in_flight_caps=(2,))  # fmt: skip
    line = async_verdict(capped, total_gpus=8)[1]
    assert ", split 6:2, queue 1 (finished batches): T=" in line


def test_async_does_not_pay_when_r_grows_faster() -> None:
    est = [REstimate(64, 0, 1, 6400, 6300, 6500), REstimate(64, 1, 1, 9600, 9000, 10000)]
    ranked = rank_async(est, TIMES)
    assert ranked[0].mode == "sync"
    assert async_verdict(ranked)[-1] == "async does not pay: R grows faster than throughput"


def test_async_pays_when_intervals_are_apart() -> None:
    est = [REstimate(64, 0, 1, 6400, 6300, 6500), REstimate(64, 2, 1, 6500, 6400, 6600)]
    assert async_verdict(rank_async(est, TIMES))[-1].startswith("async pays")


def test_splits_and_caps_are_ranked() -> None:
    times = {64: StageTimes(gen_time_s=8.0, train_update_s=2.0, sync_time_s=0.0)}  # on 8 GPUs
    est = [REstimate(64, 4, 1, 6400, 6000, 7000)]
    ranked = rank_async(est, times, total_gpus=8, splits=[2, 4, 6], in_flight_caps=[1, None])
    assert len(ranked) == 6
    best = ranked[0]
    # 6 rollout GPUs: gen 8 * 8/6 = 10.67 s, train 2 * 8/2 = 8 s -> 10.67 s per batch (best of the three)
    assert best.rollout_gpus == 6 and best.t == pytest.approx(6400 / (64 / (8 * 8 / 6)))
    assert math.isinf(rank_async([REstimate(64, 1, 1, math.inf, math.inf, math.inf)], times)[0].t)


def test_bad_input() -> None:
    with pytest.raises(AnalysisError, match="no measured"):
        rank_async([REstimate(32, 0, 1, 1, 1, 1)], TIMES)
    with pytest.raises(AnalysisError, match="not ordered"):
        rank_async([REstimate(64, 0, 1, 1, 2, 3)], TIMES)


def test_reuse_is_its_own_effect_and_async_does_not_pay() -> None:
    # reuse halves R (sync u = 2: 19 s per batch, T 950 against 1500 at u = 1); staleness at u = 2
    # costs x1.875 in R for x1.727 in throughput (11 s per batch): async does not pay, reuse does
    est = [
        REstimate(64, 0, 1, 6400, 6300, 6500),
        REstimate(64, 0, 2, 3200, 3100, 3300),
        REstimate(64, 1, 2, 6000, 5800, 6200),
    ]
    ranked = rank_async(est, TIMES, staleness_unit="steps")
    lines = async_verdict(ranked)
    assert lines[0].startswith("best sync at u=2")
    assert "against the best sync at the same u=2" in lines[2] and "samples-to-target x1.875" in lines[2]
    assert any(line.startswith("reuse, on its own (sync, u=2 against u=1): T x0.633") for line in lines)
    assert "reuse pays" in lines[-2]
    assert lines[-1] == "async does not pay: R grows faster than throughput"


def test_async_beating_sync_at_its_u_still_loses_to_sync_at_another() -> None:
    # at u = 2 async beats sync (T 1719 against 2375), but sync at u = 1 (1500) is faster still
    est = [
        REstimate(64, 0, 1, 6400, 6300, 6500),
        REstimate(64, 0, 2, 8000, 7900, 8100),
        REstimate(64, 1, 2, 10000, 9800, 10200),
    ]
    lines = async_verdict(rank_async(est, TIMES, staleness_unit="steps"))
    assert "reuse does not pay" in lines[-2]
    assert lines[-1].startswith("async does not pay: it beats sync at u=2 (T x0.724)")
    assert "sync at u=1 is faster still" in lines[-1]


def test_measured_step_times_change_async_t_as_the_simulation_says() -> None:
    # generation 0.5, 0.5, 0.5, 2.5 s (mean 1.0), training 0.9 s per update. With the means every
    # async k ties at max(1.0, 0.9) = 1.0 s per batch; played as a trace, the slow batch stalls the
    # trainer at k = 1 (1.30 s) and a deeper queue absorbs it (k = 2: 1.08 s, k = 4: 1.00 s)
    est = [REstimate(8, k, 1, 800, 700, 900) for k in (0, 1, 2, 4)]
    mean = rank_async(est, {8: StageTimes(1.0, 0.9, 0.0)}, staleness_unit="steps")
    traced = StageTimes(1.0, 0.9, 0.0, gen_trace=(0.5, 0.5, 0.5, 2.5), train_trace=(0.9,) * 4)
    trace = rank_async(est, {8: traced}, staleness_unit="steps")
    by_mean = {r.staleness: r for r in mean}
    by_trace = {r.staleness: r for r in trace}
    for k in (1, 2, 4):
        sim = simulate_pipeline(
            batch_responses=8, gen_time_s=1.0, train_time_s=0.9, sync_time_s=0.0, staleness_bound=k,
            gen_trace=(0.5, 0.5, 0.5, 2.5), train_trace=(0.9,) * 4,
        )  # fmt: skip
        assert by_trace[k].t == pytest.approx(800 / (8 / sim.batch_time_s))
        assert by_trace[k].step_times == "trace" and by_mean[k].step_times == "mean"
        assert by_mean[k].t == pytest.approx(100.0)  # 800 responses at 8 per 1.0 s
    assert [round(by_trace[k].t / 100, 2) for k in (1, 2, 4)] == [1.30, 1.08, 1.00]
    assert [r.staleness for r in mean][:1] == [1] and [r.staleness for r in trace][:1] == [4]
    # sync takes the means either way (its batch time is a sum): 1.0 + 0.9
    assert by_trace[0].t == by_mean[0].t == pytest.approx(190.0) and by_trace[0].step_times == "mean"
    # only the trace's shape is taken: a trace at twice the level gives the same rows
    doubled = StageTimes(1.0, 0.9, 0.0, gen_trace=(1.0, 1.0, 1.0, 5.0), train_trace=(1.8,) * 4)
    assert [r.t for r in rank_async(est, {8: doubled}, staleness_unit="steps")] == pytest.approx(
        [r.t for r in trace]
    )


def test_a_shared_device_row_names_no_split() -> None:
    # one device: the async row runs both sides on the whole of it. Its rollout_gpus is None, as the
    # sync row's is, and split_label tells the two apart by mode; a number is only ever a real split
    from batchtune.analysis.decide.async_rank import split_label

    est = [REstimate(64, 0, 1, 6400, 6000, 7000), REstimate(64, 1, 1, 7040, 6400, 8400)]
    one = {r.mode: r for r in rank_async(est, TIMES)}
    assert one["async"].rollout_gpus is None and one["sync"].rollout_gpus is None
    assert (split_label(one["async"], 1), split_label(one["sync"], 1)) == ("shared", "colocated")
    eight = rank_async(est, TIMES, total_gpus=8, splits=[1, 6])
    assert {r.rollout_gpus for r in eight if r.mode == "async"} == {1, 6}
    assert {split_label(r, 8) for r in eight} == {"1:7", "6:2", "colocated"}
