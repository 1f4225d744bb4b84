"""The rollout:train GPU split of the user's cluster, modelled (issue 30 item 5): the probe's one device
is shared by rollout and trainer, so no split is measured; the pipeline model predicts each split
from the per-device times instead.

Times: the stage times the joint ranking measured on one device, each side alone (generation of a
batch, one update, one weight sync), taken as one GPU's. On g GPUs each GPU gets B / g of the batch,
so a stage takes what one GPU takes for B / g: with t(B) ~ B^a over the measured batches (a least-
squares fit in log-log, ``fitted_scaling``; a in [0, 1]), t(B) / g^a (``split_times``' scaling). The
exponent is what makes a split pay: generation at a small batch per GPU is latency-bound (a < 1), so
spreading it over every GPU (colocated) gains less than the GPUs; with one batch measured no exponent
can be fitted and a = 1 (perfect data parallelism: then no split beats colocated sync). Sync
rows run colocated on all N GPUs (generate, then train); async rows (k >= 1) generate on g GPUs and
train on the other N - g, for the splits offered (default N/4, N/2 and 3N/4: 1:3, 1:1, 3:1), each with
the in-flight caps of the joint ranking. No contention between the sides (separate GPUs) and the
probe's weight-sync seconds, which a cluster's interconnect changes: both said in the notes.

A cap that does not bind (``binding_caps``) is left out, as in the joint ranking, so a tie with the
staleness bound alone is reported as the bound (queue "k", algorithm.in_flight_cap 0).

Each row carries its reason: which side is the bottleneck (the other idles) and so which way GPUs
would move. Pure, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from batchtune.analysis.decide.async_rank import (
    AsyncChoice,
    REstimate,
    SplitRanking,
    SplitRow,
    StageTimes,
    rank_async,
)

IDLE_GAP = 0.05  # idle shares closer than this count as balanced


def binding_caps(ranked: Sequence[AsyncChoice]) -> list[AsyncChoice]:
    """``ranked`` less the rows whose in-flight cap does not bind (k in trainer steps): the bound keeps
    at most k + 1 batches in flight, so a cap of k + 1 or more is the "k alone" row, and a cap that
    predicts the same T as k alone at the same split buys nothing. Every ranking (the joint one, the
    GPU splits) reports a cap only where it binds: one convention for the tables and the JSON."""
    alone = {_key(c): c.t for c in ranked if c.in_flight_cap is None}
    return [
        c
        for c in ranked
        if c.in_flight_cap is None
        or not (c.in_flight_cap >= c.staleness + 1 or same_t(c.t, alone.get(_key(c), math.nan)))
    ]


def _key(c: AsyncChoice) -> tuple[int, int, int, int | None]:
    return (c.batch, c.staleness, c.updates_per_batch, c.rollout_gpus)


def same_t(a: float, b: float) -> bool:
    return a == b or (math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=1e-9))


def default_splits(total_gpus: int) -> list[int]:
    """Rollout GPUs of the 1:3, 1:1 and 3:1 splits of ``total_gpus`` (rounded, 1 .. N - 1)."""
    n = total_gpus
    return sorted({min(n - 1, max(1, round(n * f))) for f in (0.25, 0.5, 0.75)}) if n >= 2 else []


def reason(c: AsyncChoice, total_gpus: int) -> str:
    """Why this row is where it is, in words."""
    if c.rollout_gpus is None:
        return f"colocated on all {total_gpus} GPUs: generation and training take turns, no overlap"
    g, t = c.rollout_gpus, total_gpus - c.rollout_gpus
    ri, ti = c.rollout_idle_frac, c.trainer_idle_frac
    if ri > ti + IDLE_GAP:
        return f"{g}:{t} is train-bound: the rollout idles {ri:.0%} of the time (move GPUs to training)"
    if ti > ri + IDLE_GAP:
        return f"{g}:{t} is rollout-bound: the trainer idles {ti:.0%} of the time (move GPUs to rollout)"
    return f"{g}:{t} is balanced: rollout idles {ri:.0%}, trainer {ti:.0%}"


def _exponent(points: list[tuple[float, float]]) -> float | None:
    pts = [(math.log(b), math.log(t)) for b, t in points if b > 0 and t > 0]
    if len({b for b, _ in pts}) < 2:
        return None
    mb = sum(b for b, _ in pts) / len(pts)
    mt = sum(t for _, t in pts) / len(pts)
    slope = sum((b - mb) * (t - mt) for b, t in pts) / sum((b - mb) ** 2 for b, _ in pts)
    return min(1.0, max(0.0, slope))


def fitted_scaling(one_device: Mapping[int, StageTimes]) -> tuple[float | None, float | None]:
    """(a_gen, a_train): the exponents of t(B) ~ B^a over the measured batches (module docstring);
    None where fewer than two batches were measured."""
    gen = [(float(b), t.gen_time_s) for b, t in one_device.items()]
    train = [(float(b), t.train_update_s) for b, t in one_device.items()]
    return _exponent(gen), _exponent(train)


def rank_splits(
    estimates: Sequence[REstimate],
    one_device: Mapping[int, StageTimes],
    labels: Mapping[tuple[int, int, int], str],
    *,
    total_gpus: int,
    splits: Sequence[int] = (),
    in_flight_caps: Sequence[int | None] = (None,),
    sync_every: int = 1,
    times_source: str = "",
    imported: bool = False,
) -> SplitRanking:
    """Every candidate colocated (k = 0) or at every split (k >= 1) of ``total_gpus``, best T first
    (module docstring). ``one_device``: per batch, the stage times of one device, each side alone;
    ``labels``: (B, k, u) -> candidate label; k in trainer steps, as the joint ranking counts it.
    ``imported``: the times are runs' imported from logs, not a probe's (the note says so)."""
    split = list(splits) or default_splits(total_gpus)
    n = total_gpus
    fit_g, fit_t = fitted_scaling(one_device)
    a_g, a_t = (1.0 if fit_g is None else fit_g), (1.0 if fit_t is None else fit_t)
    all_gpus = {  # the times on all N GPUs, which rank_async splits as time x (N / g)^a
        b: dataclasses.replace(t, gen_time_s=t.gen_time_s / n**a_g, train_update_s=t.train_update_s / n**a_t)
        for b, t in one_device.items()
    }
    ranked = rank_async(
        estimates,
        all_gpus,
        total_gpus=n,
        splits=split,
        in_flight_caps=in_flight_caps,
        gen_scaling=a_g,
        train_scaling=a_t,
        staleness_unit="steps",
        sync_every=sync_every,
    )
    best: dict[tuple[str, int | None], AsyncChoice] = {}
    for c in binding_caps(ranked):  # best first: one row per (candidate, split), its best cap
        key = (labels[(c.batch, c.staleness, c.updates_per_batch)], c.rollout_gpus)
        best.setdefault(key, c)
    rows = tuple(SplitRow(lab, c, reason(c, n)) for (lab, _), c in best.items())
    shown = ", ".join(f"{g}:{n - g}" for g in split)
    where = f" ({times_source})" if times_source else ""

    def said(a: float, fit: float | None, what: str) -> str:
        how = "fitted over the measured batches" if fit is not None else "one batch measured: assumed"
        return f"{what} / g^{a:.2f} ({how})"

    whose = "the imported runs'" if imported else "the probe's"
    why = (
        "the imported runs' stage times are taken as one device's, whatever GPUs they ran on"
        if imported
        else "the probe's one device ran both sides"
    )
    notes = (
        f"the GPU split is modelled, not measured: {why}, so each split of "
        f"{n} GPUs ({shown}, rollout:train) is predicted by the pipeline model from the per-device stage "
        f"times{where}: on g GPUs, {said(a_g, fit_g, 'generation')}, {said(a_t, fit_t, 'training')}; "
        f"the sides not slowing each other, and {whose} weight-sync seconds",
    )
    return SplitRanking(n, rows, notes)
