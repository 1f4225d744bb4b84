"""A time model of the RL pipeline: sync colocated, one-step-off and fully async (issue 30).

Pure (no I/O). Inputs are measured per-batch times on the devices each side holds:
``gen_time_s`` to generate one rollout batch of ``batch_responses`` responses, ``train_time_s`` to
train on one batch for all ``updates_per_batch`` (u) optimiser updates, ``sync_time_s`` for one
weight sync. Counting: update n is the n-th optimiser update (0-based); batch b feeds updates
b*u ... b*u + u - 1; the policy lag of an update is its index minus the version (number of updates
applied) of the weights that generated its batch. ``mean_staleness`` is that lag averaged over
updates, so a sync run with u updates per batch already has lag (u - 1) / 2.

Modes (docs/async.md):
- ``sync`` (colocated): generate, train, sync in turn: batch time = gen + train + sync.
- ``one_step_off``: batch b+1 is generated with the weights before batch b's updates while batch b
  trains: batch time = max(gen, train) + sync (the sync blocks both sides), lag u + (u - 1) / 2.
- ``async``: separate rollout and trainer, a weight sync every ``sync_every`` updates that pauses
  both sides, the rollout started on batch b only while (i) fewer than ``in_flight_cap`` batches are
  generated or generating but not yet taken by the trainer and (ii) its weights are at most
  ``staleness_bound`` updates behind batch b's first update. A deterministic discrete-event
  simulation (``simulate_pipeline``); when neither bound binds it meets the closed form
  max(gen, train) + sync * u / sync_every (``closed_form_time``), which the tests check.
``step_time_s`` is per optimiser update (batch time / u), as the contract with the trainer says.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from batchtune.errors import AnalysisError

MODES = ("sync", "one_step_off", "async")


@dataclass(frozen=True)
class PipelineEstimate:
    mode: str  # "sync" | "one_step_off" | "async"
    step_time_s: float  # wall seconds per optimiser step (update) in steady state
    responses_per_s: float
    rollout_idle_frac: float  # share of wall time the rollout neither generates nor syncs
    trainer_idle_frac: float  # share of wall time the trainer neither trains nor syncs
    mean_staleness: float  # mean policy lag (updates) of the consumed rollouts, per update
    batch_time_s: float = math.nan  # wall seconds per rollout batch (= step_time_s * u)
    method: str = "closed_form"  # "closed_form" | "simulation"
    # simulation only: share of the rollout's busy time during which the trainer is busy too, and
    # the other way round (what two processes on one device slow each other by; see shared_device.py)
    rollout_overlap_frac: float = math.nan
    trainer_overlap_frac: float = math.nan


def _check(batch_responses: int, gen: float, train: float, sync: float, sync_every: int, u: int) -> None:
    if batch_responses < 1:
        raise AnalysisError(f"batch_responses must be >= 1, not {batch_responses}")
    for name, v in (("gen_time_s", gen), ("train_time_s", train), ("sync_time_s", sync)):
        if not (math.isfinite(v) and v >= 0):
            raise AnalysisError(f"{name} must be a finite time >= 0, not {v}")
    if gen + train <= 0:
        raise AnalysisError("gen_time_s + train_time_s must be > 0")
    if sync_every < 1 or u < 1:
        raise AnalysisError(f"sync_every and updates_per_batch must be >= 1, not {sync_every}, {u}")


def closed_form_time(
    mode: str,
    *,
    gen_time_s: float,
    train_time_s: float,
    sync_time_s: float,
    sync_every: int = 1,
    updates_per_batch: int = 1,
) -> float:
    """Seconds per rollout batch in steady state. ``async``: valid when neither the staleness bound
    nor the in-flight cap binds (every sync pauses whichever side is busy)."""
    u = updates_per_batch
    if mode == "sync":
        return gen_time_s + train_time_s + sync_time_s
    if mode == "one_step_off":
        return max(gen_time_s, train_time_s) + sync_time_s
    if mode == "async":
        return max(gen_time_s, train_time_s) + sync_time_s * u / sync_every
    raise AnalysisError(f"unknown pipeline mode {mode!r}: use one of {', '.join(MODES)}")


def _estimate(
    mode: str,
    batch: int,
    period: float,
    gen: float,
    train: float,
    sync_per_batch: float,
    lag: float,
    u: int,
    method: str,
) -> PipelineEstimate:
    busy_r, busy_t = gen + sync_per_batch, train + sync_per_batch
    return PipelineEstimate(
        mode=mode,
        step_time_s=period / u,
        responses_per_s=batch / period if period > 0 else math.inf,
        rollout_idle_frac=max(0.0, 1.0 - busy_r / period) if period > 0 else 0.0,
        trainer_idle_frac=max(0.0, 1.0 - busy_t / period) if period > 0 else 0.0,
        mean_staleness=lag,
        batch_time_s=period,
        method=method,
    )


def min_staleness_bound(sync_every: int, updates_per_batch: int) -> int:
    """The least staleness bound that cannot deadlock: versions come in multiples of sync_every,
    batch b needs version >= b*u - k, so k >= max_b (b*u mod s) = s - gcd(u, s)."""
    return sync_every - math.gcd(updates_per_batch, sync_every)


def simulate_pipeline(
    *,
    batch_responses: int,
    gen_time_s: float,
    train_time_s: float,
    sync_time_s: float,
    staleness_bound: int | None = 1,
    in_flight_cap: int | None = None,
    sync_every: int = 1,
    updates_per_batch: int = 1,
    n_batches: int = 480,
    sync_pauses_rollout: bool = True,
    handoff_s: float = 0.0,
    gen_trace: Sequence[float] = (),
    train_trace: Sequence[float] = (),
) -> PipelineEstimate:
    """The async pipeline as a deterministic discrete-event simulation (see the module docstring).

    ``sync_pauses_rollout=False``: a sync costs only the trainer (it sends; the rollout's cost of
    loading the weights is then part of ``gen_time_s``), as in backends/torch_rl/async_run.py.
    ``handoff_s``: the latency of each message between the sides (a batch reaching the trainer,
    weights or freed queue room reaching the rollout), e.g. a measured inter-process round trip / 2.
    ``gen_trace`` / ``train_trace``: per-batch times (a measured run's, in order, repeated) in place
    of the constant ones, so the variation of the stage times plays out against the bounds; the
    constants should then be their means (the idle shares are computed from them).

    Batches are processed in order: the trainer's timeline for batches < b fixes every version and
    sync that batch b's start and pauses depend on, so one pass suffices. Steady state: the second
    half of ``n_batches`` (the rates are periodic after the warm-up).
    """
    u, s, k, cap = updates_per_batch, sync_every, staleness_bound, in_flight_cap
    _check(batch_responses, gen_time_s, train_time_s, sync_time_s, s, u)
    _check_async(k, cap, s, u, handoff_s, gen_trace, train_trace)
    hand = handoff_s
    n_batches = max(n_batches, 4 * (s // math.gcd(u, s)))
    sync_end: list[float] = [0.0]  # end time of each sync, in order (version 0 at t = 0)
    sync_start: list[float] = [0.0]
    sync_ver: list[int] = [0]
    taken: list[float] = []  # when the trainer takes batch b
    g_start: list[float] = []
    g_end: list[float] = []
    lag_sum: list[float] = []  # summed lag of batch b's u updates
    t_busy: list[tuple[float, float]] = []  # the trainer's busy interval on each batch
    rollout_free = t_tr = 0.0
    for b in range(n_batches):
        start = rollout_free
        if cap is not None and b - cap >= 0:
            start = max(start, taken[b - cap] + hand)
        if k is not None:
            i = bisect.bisect_left(sync_ver, b * u - k)  # first sync with a new-enough version
            start = max(start, sync_end[i] + hand)
        v = sync_ver[max(0, bisect.bisect_right(sync_end, start - hand) - 1)]  # latest version received
        end = start + (gen_trace[b % len(gen_trace)] if gen_trace else gen_time_s)
        if sync_pauses_rollout:
            end = _paused(start, end, sync_start, sync_end)
        g_start.append(start)
        g_end.append(end)
        lag_sum.append(sum(b * u + jj - v for jj in range(u)))
        rollout_free = end
        t = max(t_tr, end + hand)
        taken.append(t)
        per_update = (train_trace[b % len(train_trace)] if train_trace else train_time_s) / u
        t = _train(t, b, u, s, per_update, sync_time_s, (sync_start, sync_end, sync_ver))
        t_busy.append((taken[b], t))
        t_tr = t
    lo = n_batches // 2
    window = (taken[lo], taken[-1])  # steady state, both sides busy somewhere in it throughout
    r_ov, t_ov = _overlaps(_clip(list(zip(g_start, g_end, strict=True)), window), _clip(t_busy, window))
    est = _steady(
        b=n_batches,
        batch=batch_responses,
        taken=taken,
        lag_sum=lag_sum,
        gen=gen_time_s,
        train=train_time_s,
        sync_per_batch=sync_time_s * u / s,
        u=u,
        cycle=s // math.gcd(u, s),
    )
    return dataclasses.replace(est, rollout_overlap_frac=r_ov, trainer_overlap_frac=t_ov)


def _paused(start: float, end: float, sync_start: list[float], sync_end: list[float]) -> float:
    """The end of a generation from ``start`` to ``end``, each sync overlapping it pausing it."""
    for i in range(bisect.bisect_left(sync_end, start + 1e-12), len(sync_end)):
        ss, se = sync_start[i], sync_end[i]
        if ss >= end:
            break
        end += se - max(ss, start)
    return end


def _train(
    t: float,
    b: int,
    u: int,
    s: int,
    per_update: float,
    sync_s: float,
    syncs: tuple[list[float], list[float], list[int]],
) -> float:
    """Batch b's u updates from time t, a sync after every s-th update (appended to ``syncs``:
    start, end, version); returns when the trainer is done with the batch."""
    for jj in range(u):
        t += per_update
        n = b * u + jj + 1
        if n % s == 0:
            syncs[0].append(t)
            t += sync_s
            syncs[1].append(t)
            syncs[2].append(n)
    return t


def _check_async(
    k: int | None,
    cap: int | None,
    s: int,
    u: int,
    handoff_s: float,
    gen_trace: Sequence[float],
    train_trace: Sequence[float],
) -> None:
    if k is None and cap is None:
        raise AnalysisError("async needs a staleness_bound or an in_flight_cap (or both)")
    if k is not None and k < min_staleness_bound(s, u):
        raise AnalysisError(
            f"staleness_bound {k} deadlocks with sync_every {s} and updates_per_batch {u}: "
            f"it must be >= {min_staleness_bound(s, u)}"
        )
    if cap is not None and cap < 1:
        raise AnalysisError(f"in_flight_cap must be >= 1 batch, not {cap}")
    if not (math.isfinite(handoff_s) and handoff_s >= 0):
        raise AnalysisError(f"handoff_s must be a finite time >= 0, not {handoff_s}")
    for name, tr in (("gen_trace", gen_trace), ("train_trace", train_trace)):
        if any(not (math.isfinite(x) and x >= 0) for x in tr):
            raise AnalysisError(f"{name} must hold finite times >= 0")


def _clip(spans: list[tuple[float, float]], window: tuple[float, float]) -> list[tuple[float, float]]:
    lo, hi = window
    return [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi]


def _overlaps(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> tuple[float, float]:
    """(share of a's length covered by b, share of b's covered by a): two sorted lists of
    disjoint intervals each, merged in one pass."""
    i = j = 0
    both = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        both += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    len_a, len_b = sum(e - s for s, e in a), sum(e - s for s, e in b)
    return (both / len_a if len_a > 0 else 0.0), (both / len_b if len_b > 0 else 0.0)


def _steady(
    *,
    b: int,
    batch: int,
    taken: list[float],
    lag_sum: list[float],
    gen: float,
    train: float,
    sync_per_batch: float,
    u: int,
    cycle: int,
) -> PipelineEstimate:
    lo = b // 2  # the window spans whole sync cycles (cycle batches each), so a periodic state is exact
    hi = lo + cycle * max(1, (b - 1 - lo) // cycle)
    period = (taken[hi] - taken[lo]) / (hi - lo)
    lag = sum(lag_sum[lo:hi]) / ((hi - lo) * u)
    return _estimate("async", batch, period, gen, train, sync_per_batch, lag, u, "simulation")


def predict_pipeline(
    mode: str,
    *,
    batch_responses: int,
    gen_time_s: float,
    train_time_s: float,
    sync_time_s: float,
    staleness_bound: int | None = 1,
    in_flight_cap: int | None = None,
    sync_every: int = 1,
    updates_per_batch: int = 1,
    rollout_gpus: int | None = None,
    train_gpus: int | None = None,
    gen_trace: Sequence[float] = (),
    train_trace: Sequence[float] = (),
) -> PipelineEstimate:
    """Steady-state step time, throughput, idle fractions and staleness of one pipeline (module
    docstring). ``rollout_gpus`` / ``train_gpus`` only check the split (``split_times`` turns
    all-GPU timings into per-side ones); ``sync`` and ``one_step_off`` sync once per batch.
    ``gen_trace`` / ``train_trace``: measured per-batch times, played through the simulation in
    ``async`` (simulate_pipeline's); the closed forms of ``sync`` and ``one_step_off`` take the
    constants (for ``sync`` a trace's mean is exact: its batch time is a sum)."""
    u = updates_per_batch
    _check(batch_responses, gen_time_s, train_time_s, sync_time_s, sync_every, u)
    for name, g in (("rollout_gpus", rollout_gpus), ("train_gpus", train_gpus)):
        if g is not None and g < 1:
            raise AnalysisError(f"{name} must be >= 1, not {g}")
    if mode == "async":
        return simulate_pipeline(
            batch_responses=batch_responses,
            gen_time_s=gen_time_s,
            train_time_s=train_time_s,
            sync_time_s=sync_time_s,
            staleness_bound=staleness_bound,
            in_flight_cap=in_flight_cap,
            sync_every=sync_every,
            updates_per_batch=u,
            gen_trace=gen_trace,
            train_trace=train_trace,
        )
    period = closed_form_time(
        mode,
        gen_time_s=gen_time_s,
        train_time_s=train_time_s,
        sync_time_s=sync_time_s,
        updates_per_batch=u,
    )
    lag = (u - 1) / 2 + (u if mode == "one_step_off" else 0)
    return _estimate(
        mode, batch_responses, period, gen_time_s, train_time_s, sync_time_s, lag, u, "closed_form"
    )


def split_times(
    *,
    gen_time_all_s: float,
    train_time_all_s: float,
    total_gpus: int,
    rollout_gpus: int,
    gen_scaling: float = 1.0,
    train_scaling: float = 1.0,
) -> tuple[float, float]:
    """(gen seconds on rollout_gpus, train seconds on the rest) from timings on all total_gpus.

    Time on g GPUs = time on G x (G / g)^scaling: scaling 1 is perfect data parallelism (the
    optimistic default), 0 no speed-up from GPUs. An assumption to replace by measured timings."""
    if not 1 <= rollout_gpus < total_gpus:
        raise AnalysisError(f"rollout_gpus must be in 1..{total_gpus - 1}, not {rollout_gpus}")
    g = total_gpus
    return (
        gen_time_all_s * (g / rollout_gpus) ** gen_scaling,
        train_time_all_s * (g / (g - rollout_gpus)) ** train_scaling,
    )
