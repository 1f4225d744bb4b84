"""Both sides of the async pipeline on one device: two processes that slow each other where they
overlap (issue 30 item 4; the pipeline itself is pipeline.py).

``shared_device`` predicts the pipeline from each side's busy time measured ALONE (a serial run, the
two processes never at once) and a contention factor c >= 1 per side: its speed is 1 while the other
side idles and 1 / c while the other side is busy. ``fit_contention`` measures c from a short run in
which the two sides do overlap (a calibration at a cheap setting, before the runs to predict): with f
the share of a side's time that the other side is busy too (from the simulation of that run's own
setting at its measured times), busy = alone / (1 - f (1 - 1 / c)), solved for c. On shared CPU cores
c holds both the core time the processes take from each other and what they cost each other's
instructions (caches, memory bandwidth), which shows as extra CPU time, not as waiting. Pure, no I/O.
"""

from __future__ import annotations

import math

from batchtune.analysis.system.pipeline import PipelineEstimate, simulate_pipeline
from batchtune.errors import AnalysisError

C_MAX = 20.0  # a side slowed more than the overlap can explain is read as this factor


def shared_device(
    *,
    contention: float | tuple[float, float],
    batch_responses: int,
    gen_time_s: float,
    train_time_s: float,
    sync_time_s: float,
    iterations: int = 100,
    **kw: object,
) -> PipelineEstimate:
    """The async pipeline with both sides on one device (two processes on the CPU cores), from
    stage times measured ALONE and a measured ``contention`` factor c >= 1: the stage's time with
    a second process busy beside it over its time alone (one for both sides, or (gen, train)).
    A stage runs at speed 1 while the other side idles and 1 / c while it is busy, so with f the
    share of its (stretched) time overlapped, time = time_alone / (1 - f (1 - 1 / c)); f comes
    from the simulation at those times, and the fixed point is found by damped iteration.
    ``kw``: simulate_pipeline's bounds and counts."""
    c_gen, c_train = contention if isinstance(contention, tuple) else (contention, contention)
    for c in (c_gen, c_train):
        if not (math.isfinite(c) and c >= 1.0):
            raise AnalysisError(f"contention must be a finite factor >= 1, not {c}")
    g, t = gen_time_s, train_time_s
    args = dict(batch_responses=batch_responses, sync_time_s=sync_time_s, **kw)
    est = simulate_pipeline(gen_time_s=g, train_time_s=t, **args)  # type: ignore[arg-type]
    for _ in range(iterations):
        g_new = gen_time_s / (1.0 - est.rollout_overlap_frac * (1.0 - 1.0 / c_gen))
        t_new = train_time_s / (1.0 - est.trainer_overlap_frac * (1.0 - 1.0 / c_train))
        if abs(g_new - g) <= 1e-6 * g and abs(t_new - t) <= 1e-6 * max(t, 1e-12):
            break
        g, t = 0.5 * (g + g_new), 0.5 * (t + t_new)
        est = simulate_pipeline(gen_time_s=g, train_time_s=t, **args)  # type: ignore[arg-type]
    return est


def fit_contention(
    *,
    alone: tuple[float, float],
    overlapped: tuple[float, float],
    batch_responses: int,
    sync_time_s: float,
    **kw: object,
) -> tuple[float, float]:
    """(c_gen, c_train): each side's busy seconds per batch ``alone`` (rollout, trainer) and in the
    ``overlapped`` run, whose bounds and counts are ``kw`` (simulate_pipeline's). A side no slower
    overlapped than alone, or never overlapped, gets c = 1; one slower than any c explains, C_MAX."""
    for v in (*alone, *overlapped):
        if not (math.isfinite(v) and v > 0):
            raise AnalysisError(f"busy times must be finite and > 0, not {alone}, {overlapped}")
    est = simulate_pipeline(
        batch_responses=batch_responses,
        gen_time_s=overlapped[0],
        train_time_s=overlapped[1],
        sync_time_s=sync_time_s,
        **kw,  # type: ignore[arg-type]
    )
    out = []
    for a, p, f in zip(alone, overlapped, (est.rollout_overlap_frac, est.trainer_overlap_frac), strict=True):
        slow = (1.0 - a / p) / f if f > 0 else 0.0  # = 1 - 1 / c
        out.append(1.0 if slow <= 0 else C_MAX if slow >= 1 - 1 / C_MAX else 1.0 / (1.0 - slow))
    return out[0], out[1]
