"""The joint async decision (issue 30 item 5): rank (mode, B, k, u, GPU split, in-flight cap) by
predicted time-to-target T = R / Theta with intervals, and say when async does not pay.

Inputs: for each candidate (B, k, u) an estimate of samples-to-target R with an interval (the probe's,
e.g. paired-bootstrap), and measured per-batch times on ALL GPUs (generation of B responses, one
training update on B, one weight sync). k = 0 runs colocated and synchronous on every GPU; k >= 1
runs the async pipeline (batchtune/analysis/system/pipeline.py) with the staleness bound k, one sync per
batch, for every rollout:train split and in-flight cap offered, the per-side times scaled from the
all-GPU ones by ``split_times`` (an assumption: ``gen_scaling`` / ``train_scaling``). The interval of
T carries R's interval only; the time model is taken as exact (its own error is measured by
benchmarks/pipeline_*.py). Pure, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from batchtune.analysis.system.pipeline import predict_pipeline, split_times
from batchtune.errors import AnalysisError


@dataclass(frozen=True)
class REstimate:
    batch: int  # responses per rollout batch
    staleness: int  # k
    updates_per_batch: int  # u
    r: float  # samples-to-target (point estimate); inf when the target was not reached
    r_lo: float
    r_hi: float


@dataclass(frozen=True)
class StageTimes:
    gen_time_s: float  # one rollout batch of B responses, on all GPUs
    train_update_s: float  # one optimiser update on B responses, on all GPUs
    sync_time_s: float


@dataclass(frozen=True)
class AsyncChoice:
    mode: str  # "sync" | "async"
    batch: int
    staleness: int
    updates_per_batch: int
    rollout_gpus: int | None  # None: colocated on all GPUs
    in_flight_cap: int | None  # batches; None: the staleness bound alone
    responses_per_s: float
    lag_reached: float  # mean policy lag per update from the pipeline model
    trainer_idle_frac: float
    rollout_idle_frac: float
    t: float  # predicted time-to-target, seconds
    t_lo: float
    t_hi: float


def _choices(
    est: REstimate,
    times: StageTimes,
    total_gpus: int,
    splits: Sequence[int],
    caps: Sequence[int | None],
    gen_scaling: float,
    train_scaling: float,
) -> list[AsyncChoice]:
    u, k = est.updates_per_batch, est.staleness
    train_all = times.train_update_s * u
    out = []
    configs: list[tuple[int | None, int | None]] = (
        [(None, None)] if k == 0 else [(g, c) for g in splits for c in caps]
    )
    for g, cap in configs:
        if g is None:
            e = predict_pipeline(
                "sync",
                batch_responses=est.batch,
                gen_time_s=times.gen_time_s,
                train_time_s=train_all,
                sync_time_s=times.sync_time_s,
                updates_per_batch=u,
            )
        else:
            gen, train = split_times(
                gen_time_all_s=times.gen_time_s,
                train_time_all_s=train_all,
                total_gpus=total_gpus,
                rollout_gpus=g,
                gen_scaling=gen_scaling,
                train_scaling=train_scaling,
            )
            e = predict_pipeline(
                "async",
                batch_responses=est.batch,
                gen_time_s=gen,
                train_time_s=train,
                sync_time_s=times.sync_time_s,
                staleness_bound=k,
                in_flight_cap=cap,
                sync_every=u,
                updates_per_batch=u,
                rollout_gpus=g,
                train_gpus=total_gpus - g,
            )
        th = e.responses_per_s
        out.append(
            AsyncChoice(
                mode="sync" if g is None else "async",
                batch=est.batch,
                staleness=k,
                updates_per_batch=u,
                rollout_gpus=g,
                in_flight_cap=cap,
                responses_per_s=th,
                lag_reached=e.mean_staleness,
                trainer_idle_frac=e.trainer_idle_frac,
                rollout_idle_frac=e.rollout_idle_frac,
                t=est.r / th,
                t_lo=est.r_lo / th,
                t_hi=est.r_hi / th,
            )
        )
    return out


def rank_async(
    estimates: Sequence[REstimate],
    times: Mapping[int, StageTimes],
    *,
    total_gpus: int = 1,
    splits: Sequence[int] = (),
    in_flight_caps: Sequence[int | None] = (None,),
    gen_scaling: float = 1.0,
    train_scaling: float = 1.0,
) -> list[AsyncChoice]:
    """Every (mode, B, k, u, split, cap) the inputs allow, best predicted T first (module docstring).

    ``times`` maps each batch to its measured StageTimes; ``splits`` are rollout GPU counts
    (1..total_gpus-1) for the async candidates, default the even split. With one GPU an async
    candidate shares it: rollout and trainer each get the whole device (the two-process CPU case)."""
    if not estimates:
        raise AnalysisError("rank_async needs at least one R estimate")
    if total_gpus < 1:
        raise AnalysisError(f"total_gpus must be >= 1, not {total_gpus}")
    rows: list[AsyncChoice] = []
    for est in estimates:
        if est.batch not in times:
            raise AnalysisError(f"no measured gen/train/sync times for batch {est.batch}")
        if not est.r_lo <= est.r <= est.r_hi:
            raise AnalysisError(
                f"R interval of B={est.batch} k={est.staleness} u={est.updates_per_batch} "
                f"is not ordered: {est.r_lo} <= {est.r} <= {est.r_hi}"
            )
        if total_gpus == 1:  # no split to make: each side on the one device (times as measured)
            rows += _choices(est, times[est.batch], 2, [1], in_flight_caps, 0.0, 0.0)
        else:
            rows += _choices(
                est,
                times[est.batch],
                total_gpus,
                list(splits) or [total_gpus // 2],
                in_flight_caps,
                gen_scaling,
                train_scaling,
            )
    # ties (to 9 digits: the simulation and the closed forms differ by rounding) go to the simpler
    return sorted(rows, key=lambda r: (float(f"{r.t:.9g}"), r.mode != "sync", r.staleness, r.t_hi))


def async_verdict(ranked: Sequence[AsyncChoice]) -> list[str]:
    """Reasons, one a line: which mode wins, by how much, and when async does not pay (the best
    async choice's R grows faster than its throughput over the best sync choice)."""
    sync = [r for r in ranked if r.mode == "sync" and math.isfinite(r.t)]
    # an async choice whose rollout never runs a batch ahead (lag no more than the in-batch (u-1)/2,
    # e.g. k < u) is the sync pipeline under another name: not evidence for async
    asy = [
        r
        for r in ranked
        if r.mode == "async" and math.isfinite(r.t) and r.lag_reached > (r.updates_per_batch - 1) / 2 + 1e-9
    ]
    if not sync or not asy:
        which = "sync" if sync else "async" if asy else "none"
        return [f"only one mode reached the target with real overlap: {which}"]
    s, a = sync[0], asy[0]
    theta_gain = a.responses_per_s / s.responses_per_s
    r_growth = (a.t * a.responses_per_s) / (s.t * s.responses_per_s)
    lines = [
        f"best sync: B={s.batch} u={s.updates_per_batch} T={s.t:.4g} s [{s.t_lo:.4g}, {s.t_hi:.4g}]",
        f"best async: B={a.batch} k={a.staleness} u={a.updates_per_batch} split={a.rollout_gpus} "
        f"cap={a.in_flight_cap} T={a.t:.4g} s [{a.t_lo:.4g}, {a.t_hi:.4g}], lag reached "
        f"{a.lag_reached:.2f}",
        f"async throughput x{theta_gain:.3f}, samples-to-target x{r_growth:.3f}",
    ]
    if r_growth >= theta_gain:
        lines.append("async does not pay: R grows faster than throughput")
    elif a.t_hi < s.t_lo:
        lines.append(f"async pays: T x{a.t / s.t:.3f}, intervals apart")
    else:
        lines.append(f"async is ahead (T x{a.t / s.t:.3f}) but the intervals overlap: not decided")
    return lines
