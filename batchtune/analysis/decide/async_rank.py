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

Units of k: ``staleness_unit="updates"`` (the NQM's delay d, the pipeline model's bound) or
``"steps"``: the built-in trainer's k, in trainer steps (rollout batches), as verl and prime-rl count
it; a bound of k steps is k * u updates, and ``sync_every`` (trainer steps) is sync_every * u updates.
``async_times``: the per-side times the async rows use when they differ from the sync rows' (on one
shared device, what the two-process runs measured while both sides ran). Where those times carry
the measured steps' own times (``StageTimes.gen_trace`` / ``train_trace``), the async rows play them
through the simulation (``step_times = "trace"``), else they take the means (``"mean"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from batchtune.analysis.decide.async_topup import TopUpEnd
from batchtune.analysis.system.pipeline import PipelineEstimate, predict_pipeline, split_times
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
    # measured steps' own times in order (gen s per batch, train s per update), or (): the async rows
    # play them through the simulation, scaled so their means are the rows' times (only their shape
    # is taken: a slow batch stalls a short queue, a deeper one absorbs it)
    gen_trace: tuple[float, ...] = ()
    train_trace: tuple[float, ...] = ()


@dataclass(frozen=True)
class AsyncChoice:
    mode: str  # "sync" | "async"
    batch: int
    staleness: int
    updates_per_batch: int
    # None: colocated on all GPUs (mode "sync"), or one device both sides share (mode "async"): the
    # JSON and the emitters read a number as a rollout:train split (split_label says which)
    rollout_gpus: int | None
    in_flight_cap: int | None  # batches; None: the staleness bound alone
    responses_per_s: float
    lag_reached: float  # mean policy lag per update from the pipeline model
    trainer_idle_frac: float
    rollout_idle_frac: float
    t: float  # predicted time-to-target, seconds
    t_lo: float
    t_hi: float
    step_times: str = "mean"  # "trace": the measured steps' own times played through the simulation


@dataclass(frozen=True)
class _Setting:
    total_gpus: int
    splits: Sequence[int]
    caps: Sequence[int | None]
    gen_scaling: float
    train_scaling: float
    steps: bool = False  # k and sync_every in trainer steps (else k in updates, one sync per batch)
    sync_every: int = 1  # trainer steps per weight sync (steps only)
    shared: bool = False  # one device: each side on the whole of it (the model's 1:1 of 2, unscaled)


@dataclass(frozen=True)
class AsyncPick:
    """How to run the recommended candidate: what the emitters write in each trainer's units
    (contract: /work/notes of issue 30; docs/async.md)."""

    label: str  # the winner's candidate label, e.g. "P4xG8-k1u2"
    mode: str  # "sync" (colocated, generate then train) | "async" (separate rollout and trainer)
    staleness: int  # k, in trainer steps (rollout batches), as verl and prime-rl count it; 0 = on-policy
    updates_per_batch: int  # u = mini_batches x epochs per rollout batch
    mini_batches: int  # optimiser steps per epoch; epochs = updates_per_batch // mini_batches
    sync_every: int  # a weight sync every this many trainer steps (1 = every batch)
    # finished rollout batches queued for the trainer, as algorithm.in_flight_cap counts them (one more
    # is being generated); 0 = the staleness bound alone (k queued), and 0 for mode "sync"
    in_flight_cap: int
    rollout_gpus: int | None  # None: colocated (mode "sync"), or one device both sides share
    train_gpus: int | None
    total_gpus: int
    split_note: str = ""  # why the split is not the model's best (--emit: the trainer takes no such split)


def queue_cap(in_flight_batches: int | None) -> int:
    """The pipeline model's in-flight cap (batches generated or generating, not yet taken; None: the
    bound alone) as the trainer's algorithm.in_flight_cap (finished batches queued; 0: the bound)."""
    return 0 if in_flight_batches is None else max(1, in_flight_batches - 1)


def split_label(c: AsyncChoice, total_gpus: int) -> str:
    """Where a choice runs, as the tables, the verdict and the JSON's ``split`` say it: "colocated"
    (sync), "shared" (async on one device, rollout and trainer each the whole of it; rollout_gpus
    None) or rollout:train GPUs of ``total_gpus``."""
    g = c.rollout_gpus
    if g is None:
        return "colocated" if c.mode == "sync" else "shared"
    return "shared" if total_gpus == 1 else f"{g}:{total_gpus - g}"


def queue_label(c: AsyncChoice) -> str:
    """The finished batches queued, as the tables and the verdict say it: "-" for sync, "k" for the
    staleness bound alone, else algorithm.in_flight_cap (``queue_cap``)."""
    if c.mode == "sync":
        return "-"
    return "k" if c.in_flight_cap is None else str(queue_cap(c.in_flight_cap))


@dataclass(frozen=True)
class JointRow:
    """One ranked (mode, P, G, k, u, split, in-flight cap)."""

    label: str
    prompts: int
    group_size: int
    choice: AsyncChoice


@dataclass(frozen=True)
class SplitRow:
    """One candidate at one rollout:train split of the user's cluster (analysis/decide/async_split.py)."""

    label: str
    choice: AsyncChoice  # rollout_gpus None: colocated sync on every GPU
    reason: str  # which side is the bottleneck, in words


@dataclass(frozen=True)
class SplitRanking:
    """The modelled (not measured) GPU splits of ``total_gpus``, best predicted T first."""

    total_gpus: int
    rows: tuple[SplitRow, ...]
    notes: tuple[str, ...]

    def best_for(self, label: str) -> SplitRow | None:
        return next((r for r in self.rows if r.label == label), None)


@dataclass(frozen=True)
class JointDecision:
    """The ranking over modes and off-policy knobs, its verdict and the pick (decide/async_joint.py)."""

    rows: tuple[JointRow, ...]  # best predicted T first
    verdict: tuple[str, ...]  # reasons, one a line; the last says whether async pays
    status: str  # "pays" | "does not pay" | "not decided" | "one mode"
    times_source: str  # where the stage times come from, in words
    notes: tuple[str, ...] = ()
    pick: AsyncPick | None = None  # the recommendation's winner in its best row
    total_gpus: int = 1  # the devices ranked over (1: rollout and trainer share one)
    splits: SplitRanking | None = None  # the user's cluster, split rollout:train, modelled
    top_up_end: TopUpEnd | None = None  # where the probe's seed top-up stopped (measure/async_topup.py)


def _shaped(trace: Sequence[float], to_mean: float) -> tuple[float, ...]:
    """``trace`` scaled so that its mean is ``to_mean`` (its shape kept); () without one."""
    m = sum(trace) / len(trace) if trace else 0.0
    return tuple(x * to_mean / m for x in trace) if m > 0 else ()


def _async_estimate(
    est: REstimate, atimes: StageTimes, st: _Setting, g: int, cap: int | None
) -> PipelineEstimate:
    u, k = est.updates_per_batch, est.staleness
    gen, train = split_times(
        gen_time_all_s=atimes.gen_time_s,
        train_time_all_s=atimes.train_update_s * u,
        total_gpus=st.total_gpus,
        rollout_gpus=g,
        gen_scaling=st.gen_scaling,
        train_scaling=st.train_scaling,
    )
    return predict_pipeline(
        "async",
        batch_responses=est.batch,
        gen_time_s=gen,
        train_time_s=train,
        sync_time_s=atimes.sync_time_s,
        staleness_bound=k * u if st.steps else k,
        in_flight_cap=cap,
        sync_every=u * st.sync_every if st.steps else u,
        updates_per_batch=u,
        rollout_gpus=g,
        train_gpus=st.total_gpus - g,
        gen_trace=_shaped(atimes.gen_trace, gen),
        train_trace=_shaped(atimes.train_trace, train),
    )


def _choices(est: REstimate, times: StageTimes, atimes: StageTimes, st: _Setting) -> list[AsyncChoice]:
    u, k = est.updates_per_batch, est.staleness
    out = []
    configs: list[tuple[int | None, int | None]] = (
        [(None, None)] if k == 0 else [(g, c) for g in st.splits for c in st.caps]
    )
    traced = bool(atimes.gen_trace or atimes.train_trace)
    for g, cap in configs:
        if g is None:
            e = predict_pipeline(
                "sync",
                batch_responses=est.batch,
                gen_time_s=times.gen_time_s,
                train_time_s=times.train_update_s * u,
                sync_time_s=times.sync_time_s,
                updates_per_batch=u,
            )
        else:
            e = _async_estimate(est, atimes, st, g, cap)
        th = e.responses_per_s
        out.append(
            AsyncChoice(
                mode="sync" if g is None else "async",
                batch=est.batch,
                staleness=k,
                updates_per_batch=u,
                rollout_gpus=None if st.shared else g,  # shared: no split for a reader to take
                in_flight_cap=cap,
                responses_per_s=th,
                lag_reached=e.mean_staleness,
                trainer_idle_frac=e.trainer_idle_frac,
                rollout_idle_frac=e.rollout_idle_frac,
                t=est.r / th,
                t_lo=est.r_lo / th,
                t_hi=est.r_hi / th,
                step_times="trace" if traced and g is not None else "mean",
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
    staleness_unit: str = "updates",
    sync_every: int = 1,
    async_times: Mapping[int, StageTimes] | None = None,
) -> list[AsyncChoice]:
    """Every (mode, B, k, u, split, cap) the inputs allow, best predicted T first (module docstring).

    ``times`` maps each batch to its measured StageTimes; ``splits`` are rollout GPU counts
    (1..total_gpus-1) for the async candidates, default the even split. With one GPU an async
    candidate shares it: rollout and trainer each get the whole device (the two-process CPU case).
    ``staleness_unit``, ``sync_every`` and ``async_times``: the module docstring."""
    if not estimates:
        raise AnalysisError("rank_async needs at least one R estimate")
    if total_gpus < 1:
        raise AnalysisError(f"total_gpus must be >= 1, not {total_gpus}")
    if staleness_unit not in ("updates", "steps"):
        raise AnalysisError(f"staleness_unit must be updates or steps, not {staleness_unit!r}")
    steps = staleness_unit == "steps"
    if total_gpus == 1:  # no split to make: each side on the one device (times as measured)
        st = _Setting(2, [1], in_flight_caps, 0.0, 0.0, steps, sync_every, shared=True)
    else:
        split = list(splits) or [total_gpus // 2]
        st = _Setting(total_gpus, split, in_flight_caps, gen_scaling, train_scaling, steps, sync_every)
    rows: list[AsyncChoice] = []
    for est in estimates:
        if est.batch not in times:
            raise AnalysisError(f"no measured gen/train/sync times for batch {est.batch}")
        if not est.r_lo <= est.r <= est.r_hi:
            raise AnalysisError(
                f"R interval of B={est.batch} k={est.staleness} u={est.updates_per_batch} "
                f"is not ordered: {est.r_lo} <= {est.r} <= {est.r_hi}"
            )
        t = times[est.batch]
        rows += _choices(est, t, (async_times or {}).get(est.batch, t), st)
    # ties (to 9 digits: the simulation and the closed forms differ by rounding) go to the simpler
    return sorted(rows, key=lambda r: (float(f"{r.t:.9g}"), r.mode != "sync", r.staleness, r.t_hi))


def _overlapping(ranked: Sequence[AsyncChoice]) -> list[AsyncChoice]:
    """The async choices that reach the target with real overlap. One whose rollout never runs a
    batch ahead (lag no more than the in-batch (u-1)/2, e.g. k < u) is the sync pipeline under
    another name: not evidence for async."""
    return [
        r
        for r in ranked
        if r.mode == "async" and math.isfinite(r.t) and r.lag_reached > (r.updates_per_batch - 1) / 2 + 1e-9
    ]


def _reuse_line(sync: Sequence[AsyncChoice]) -> str | None:
    """Reuse as its own effect: the best sync choice at u > the least u against the best at the
    least u (both on-policy, so staleness plays no part); None with one u."""
    us = sorted({r.updates_per_batch for r in sync})
    if len(us) < 2:
        return None
    base = next(r for r in sync if r.updates_per_batch == us[0])
    more = next(r for r in sync if r.updates_per_batch != us[0])
    ratio = more.t / base.t
    theta = more.responses_per_s / base.responses_per_s
    r_growth = ratio * theta
    says = "reuse pays" if ratio < 1 else "reuse does not pay"
    return (
        f"reuse, on its own (sync, u={more.updates_per_batch} against u={base.updates_per_batch}): "
        f"T x{ratio:.3f} (throughput x{theta:.3f}, samples-to-target x{r_growth:.3f}): {says}"
    )


def _queue_words(c: AsyncChoice) -> str:
    q = queue_label(c)
    return f"{q} (the staleness bound alone)" if q == "k" else f"{q} (finished batches)"


def async_verdict(ranked: Sequence[AsyncChoice], total_gpus: int = 1) -> list[str]:
    """Reasons, one a line: which mode wins, by how much, and when async does not pay.

    Staleness and reuse are told apart: the best async choice (k >= 1, updates u) is compared with
    the best sync choice at the same u, so a gain from reusing each batch u times (which a sync run
    at that u has too) is not counted for async; reuse is reported on its own line (sync at u against
    sync at the least u). Async does not pay when its R grows faster than its throughput over sync
    at its u. With no sync choice at that u that reached the target, the best sync choice at any u
    is the comparison, and a line says the two effects are not separated there. ``total_gpus``: the
    devices ``ranked`` runs on (1: rollout and trainer share one), for the split's words."""
    sync = [r for r in ranked if r.mode == "sync" and math.isfinite(r.t)]
    asy = _overlapping(ranked)
    if not sync or not asy:
        which = "sync" if sync else "async" if asy else "none"
        return [f"only one mode reached the target with real overlap: {which}"]
    a = asy[0]
    same = [r for r in sync if r.updates_per_batch == a.updates_per_batch]
    s = same[0] if same else sync[0]
    theta_gain = a.responses_per_s / s.responses_per_s
    r_growth = (a.t * a.responses_per_s) / (s.t * s.responses_per_s)
    against = (
        f"against the best sync at the same u={a.updates_per_batch}, so reuse is not in it"
        if same
        else f"against the best sync (u={s.updates_per_batch}): no sync run at u={a.updates_per_batch} "
        "reached the target, so reuse and staleness are not separated here"
    )
    lines = [
        f"best sync at u={s.updates_per_batch}: B={s.batch} T={s.t:.4g} s [{s.t_lo:.4g}, {s.t_hi:.4g}]",
        f"best async: B={a.batch} k={a.staleness} u={a.updates_per_batch}, split "
        f"{split_label(a, total_gpus)}, queue {_queue_words(a)}: T={a.t:.4g} s [{a.t_lo:.4g}, "
        f"{a.t_hi:.4g}], lag reached {a.lag_reached:.2f}",
        f"async throughput x{theta_gain:.3f}, samples-to-target x{r_growth:.3f} ({against})",
    ]
    reuse = _reuse_line(sync)
    if reuse is not None:
        lines.append(reuse)
    best = sync[0]  # the best sync choice at any u: async must beat it too to pay
    if r_growth >= theta_gain:
        lines.append("async does not pay: R grows faster than throughput")
        return lines
    if a.t >= best.t:
        lines.append(
            f"async does not pay: it beats sync at u={s.updates_per_batch} (T x{a.t / s.t:.3f}), but "
            f"sync at u={best.updates_per_batch} is faster still (T x{best.t / a.t:.3f} of async's)"
        )
        return lines
    s = best
    if a.t_lo == a.t_hi or s.t_lo == s.t_hi:  # one seed: no interval to tell them apart
        which = "async" if a.t_lo == a.t_hi else "sync"
        lines.append(
            f"async is ahead (T x{a.t / s.t:.3f}) but the best {which} R rests on one seed, with no "
            "interval: not decided"
        )
    elif a.t_hi < s.t_lo:
        lines.append(f"async pays: T x{a.t / s.t:.3f}, intervals apart")
    else:
        lines.append(f"async is ahead (T x{a.t / s.t:.3f}) but the intervals overlap: not decided")
    return lines


def verdict_status(lines: Sequence[str]) -> str:
    """The verdict of ``async_verdict``'s lines in two or three words."""
    last = lines[-1] if lines else ""
    if last.startswith("async does not pay"):
        return "does not pay"
    if last.startswith("async pays"):
        return "pays"
    return "not decided" if last.endswith("not decided") else "one mode"
