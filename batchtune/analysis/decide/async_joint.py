"""The joint decision of `recommend` over sync and async runs (issue 30 item 5): R(B, k, u) from the
probe's estimates, stage times from its records, T = R / Theta from the pipeline model.

For every main (on-policy) and off-policy candidate with an estimate, R and its interval are the
efficiency code's (seeds paired on one samples axis; the low end is the censoring bound where seeds
never reached the target, as in the main ranking). Stage times per batch B:

- sync rows: generation = the throughput model's gen_s + other_s of the on-policy candidate at B
  (k = 0 at the on-policy u of its batch shape: a probe's algorithm.mini_batches, an import's u,
  which grows with the batch at verl's fixed ppo_mini_batch_size; the rollout side: reward,
  reference log-probs), one update = its train_s / that u, a weight
  sync = the median ``sync_s`` its runs recorded (0 in one process: nothing to send);
- async rows: the same, times what the two-process runs (``algorithm.mode = "async"``, k >= 1)
  measured while both sides ran, over what the k = 0 runs at B (every u; strict alternation, one side
  at a time) measured: the ratio of median gen_s and of median train per update (at least 1:
  sharing a device only slows a side), and their own median sync_s. The ratio is taken within the
  probe, so a machine whose load drifts while it runs biases it (the runs at k >= 1 run later). A
  recipe whose off-policy runs ran in one process measured no overlap: the async rows then assume
  the sides overlap freely with no sync cost (said in the notes), a best case.

Where the auto sweep timed the on-policy candidate at B (``async_sweep.json``), its timed steps' own
times go with these times: the async rows play them, scaled to the rows' means, through the pipeline
simulation, so a slow batch stalls a short queue as it did in the timing (each row's ``step_times``
says "trace"); elsewhere they take the means ("mean"). Sync rows take the means either way (a sync
batch time is a sum, which the mean gives exactly).

``async_rank.rank_async`` ranks (mode, B, k, u, split, cap) with k in trainer steps; caps that
cannot bind (k + 1 batches or more) are the "k alone" row. ``joint_throughput`` gives the main
ranking each candidate's best-row throughput, so its one ranking covers both modes. Pure, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence

from batchtune.analysis.decide.async_rank import (
    AsyncPick,
    JointDecision,
    JointRow,
    REstimate,
    StageTimes,
    async_verdict,
    queue_cap,
    rank_async,
    verdict_status,
)
from batchtune.analysis.decide.async_split import binding_caps, rank_splits
from batchtune.analysis.decide.recommend import ThroughputModel
from batchtune.analysis.sample.efficiency import CandidateEfficiency, SampleEfficiency
from batchtune.errors import AnalysisError

Trace = tuple[Sequence[float], Sequence[float]]  # (gen s per batch, train s per update), in order

# batches generated or generating, not yet taken (the pipeline model's count; None: the staleness bound
# alone): 2, 3, 5 are the trainer's queues of 1, 2, 4 finished batches (one more being generated)
IN_FLIGHT_CAPS: tuple[int | None, ...] = (2, 3, 5, None)


@dataclasses.dataclass(frozen=True)
class Knobs:
    """What a candidate's runs recorded about how they ran."""

    staleness: int  # k, trainer steps
    updates_per_batch: int  # u
    sync_s: float = 0.0  # median seconds of one weight sync (0: none recorded)


def _r_interval(eff: SampleEfficiency, c: CandidateEfficiency) -> tuple[float, float, float] | None:
    est = c.estimate
    if est is None:
        return None
    lo, hi = eff.absolute_ci(est)
    if not math.isfinite(lo):  # most seeds censored: R is at least what they ran for
        lo = max((b for b in est.censored_at if b is not None and math.isfinite(b)), default=math.inf)
    r = est.samples_to_target
    return min(lo, r), r, max(hi, r)


def _ratio(values: Sequence[float], base: float) -> float:
    """Median of ``values`` over ``base``, at least 1 (nothing measured or no base: 1)."""
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    if not vals or base <= 0:
        return 1.0
    return max(1.0, statistics.median(vals) / base)


def _median(values: Sequence[float]) -> float:
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    return statistics.median(vals) if vals else 0.0


def _per_update(c: CandidateEfficiency, knobs: Mapping[str, Knobs]) -> float:
    return c.train_s_per_step / knobs[c.label].updates_per_batch


def _stage_times(
    eff: SampleEfficiency,
    thr: ThroughputModel,
    knobs: Mapping[str, Knobs],
    on_policy_u: Callable[[CandidateEfficiency], int],
    two_process: bool,
    traces: Mapping[str, Trace],
) -> tuple[dict[int, StageTimes], dict[int, StageTimes], list[str]]:
    """(sync-row times, async-row times) per batch, and what they assumed (module docstring)."""
    cands = [c for c in eff.candidates if c.label in knobs]
    sync_t: dict[int, StageTimes] = {}
    async_t: dict[int, StageTimes] = {}
    notes: list[str] = []
    for c in cands:
        kn, u = knobs[c.label], on_policy_u(c)
        if c.family != "main" or (kn.staleness, kn.updates_per_batch) != (0, u):
            continue
        t = thr.per_candidate.get(c.label)
        if t is None:
            continue
        b = c.batch_responses
        gen = (c.gen_s_per_step if t.gen_s is None else t.gen_s) + (t.other_s or 0.0)
        upd = (c.train_s_per_step if t.train_s is None else t.train_s) / u
        gt, tt = traces.get(c.label, ((), ()))
        sync_t[b] = StageTimes(gen, upd, kn.sync_s, tuple(gt), tuple(tt))
        if gt or tt:
            notes.append(
                f"B={b}: the async rows play {c.label}'s {max(len(gt), len(tt))} timed steps' own times "
                "(async_sweep.json) through the pipeline simulation, scaled to the rows' mean times"
            )
        at_b = [x for x in cands if x.batch_responses == b]
        stale = [x for x in at_b if knobs[x.label].staleness >= 1]
        if not two_process or not stale:
            async_t[b] = sync_t[b]
            continue
        fresh = [x for x in at_b if knobs[x.label].staleness == 0]  # every u: gen does not depend on it
        fg = _ratio([x.gen_s_per_step for x in stale], _median([x.gen_s_per_step for x in fresh]))
        ft = _ratio([_per_update(x, knobs) for x in stale], _median([_per_update(x, knobs) for x in fresh]))
        syncs = [knobs[x.label].sync_s for x in stale if knobs[x.label].sync_s > 0]
        sync_a = statistics.median(syncs) if syncs else kn.sync_s
        async_t[b] = dataclasses.replace(
            sync_t[b], gen_time_s=gen * fg, train_update_s=upd * ft, sync_time_s=sync_a
        )
        notes.append(
            f"B={b}: the async rows take gen x{fg:.2f} and train x{ft:.2f} of the on-policy runs' times, "
            "as the two-process runs measured them while both sides ran"
        )
    if not two_process:
        notes.append(
            "the off-policy runs ran in one process (algorithm.mode = sync), so no overlap was measured: "
            "the async rows assume generation and training overlap without slowing each other and a "
            'free weight sync, a best case (algorithm.mode = "async" measures both)'
        )
    return sync_t, async_t, notes


def joint_decision(
    eff: SampleEfficiency,
    thr: ThroughputModel,
    knobs: Mapping[str, Knobs],
    *,
    mini_batches: int,
    two_process: bool,
    sync_every: int = 1,
    in_flight_caps: Sequence[int | None] = IN_FLIGHT_CAPS,
    cluster_gpus: int = 0,
    traces: Mapping[str, Trace] | None = None,
    on_policy_u: Mapping[tuple[int, int], int] | None = None,
) -> JointDecision:
    """Rank every (mode, P, G, k, u, split, cap) of the main and off-policy candidates (module
    docstring). ``knobs``: label -> what its runs recorded; ``two_process``: the off-policy runs ran
    as rollout worker and trainer (their step times include the overlap's contention);
    ``sync_every``: trainer steps per weight sync of those runs. The probe's device is the one device
    (rollout and trainer share it); ``cluster_gpus`` >= 2: the splits of that many GPUs are ranked as
    well, modelled from the one device's times (analysis/decide/async_split.py). ``traces``: main
    label -> its timed steps' own (gen s per batch, train s per update), in order (the auto sweep's):
    the async rows play them through the simulation (module docstring). ``on_policy_u``: per batch
    shape (P, G), the updates per rollout batch of the on-policy runs the others at that shape are
    ranked against (records/types.on_policy_updates: an import's, e.g. PPO's u = 4 where its recipe
    says 1 mini-batch); a shape it lacks, or None: a probe's, ``mini_batches``."""
    us = on_policy_u or {}

    def u_of(c: CandidateEfficiency) -> int:
        return us.get((c.prompts, c.group_size), mini_batches)

    sync_t, async_t, notes = _stage_times(eff, thr, knobs, u_of, two_process, traces or {})
    ests: list[REstimate] = []
    who: dict[tuple[int, int, int], CandidateEfficiency] = {}
    too_fresh: list[str] = []
    for c in eff.candidates:
        kn = knobs.get(c.label)
        iv = _r_interval(eff, c) if kn is not None and c.family in ("main", "offpolicy") else None
        if kn is None or iv is None or c.batch_responses not in sync_t:
            continue
        if 1 <= kn.staleness < sync_every - 1:  # the trainer refuses it: a bound sync_every cannot keep
            too_fresh.append(f"{c.label} (k = {kn.staleness})")
            continue
        key = (c.batch_responses, kn.staleness, kn.updates_per_batch)
        if key in who:  # two candidates at one (B, k, u): another group size; the first ranks
            continue
        who[key] = c
        ests.append(REstimate(*key, iv[1], iv[0], iv[2]))
    if too_fresh:
        notes.append(_too_fresh_note(too_fresh, sync_every))
    if not ests:
        raise AnalysisError("no on-policy candidate with an estimate and timings to rank async runs against")
    ranked = rank_async(
        ests,
        sync_t,
        in_flight_caps=in_flight_caps,
        staleness_unit="steps",
        sync_every=sync_every,
        async_times=async_t,
    )
    rows = []
    for ch in binding_caps(ranked):  # a cap that does not bind is the bound alone: left out
        c = who[(ch.batch, ch.staleness, ch.updates_per_batch)]
        rows.append(JointRow(c.label, c.prompts, c.group_size, ch))
    verdict = async_verdict([r.choice for r in rows])  # on the one device: total_gpus 1
    whose = "the imported runs'" if eff.imported else "the probe's"  # no probe ran imported runs
    source = f"stage times: {thr.source} (generation, training), weight syncs from {whose} records"
    splits = None
    if cluster_gpus >= 2:
        labels = {key: c.label for key, c in who.items()}
        splits = rank_splits(
            ests, sync_t, labels, total_gpus=cluster_gpus, in_flight_caps=in_flight_caps,
            sync_every=sync_every, times_source=thr.source, imported=eff.imported,
        )  # fmt: skip
    return JointDecision(
        tuple(rows), tuple(verdict), verdict_status(verdict), source, tuple(notes), splits=splits
    )


def _too_fresh_note(labels: Sequence[str], sync_every: int) -> str:
    return (
        f"not ranked: {', '.join(labels)}: k < sync_every - 1 = {sync_every - 1}; the async trainer "
        f"cannot keep rollouts that fresh when it syncs weights every {sync_every} steps "
        "(algorithm.sync_every)"
    )


def joint_throughput(thr: ThroughputModel, decision: JointDecision) -> ThroughputModel:
    """``thr`` with each ranked candidate's throughput replaced by its best row's (the main ranking
    then orders sync and async candidates on one footing)."""
    per = dict(thr.per_candidate)
    seen: set[str] = set()
    for row in decision.rows:  # best first
        if row.label in seen or row.label not in per:
            continue
        seen.add(row.label)
        per[row.label] = dataclasses.replace(per[row.label], responses_per_s=row.choice.responses_per_s)
    note = "candidates at staleness k >= 1 are ranked at their best async pipeline's throughput"
    return dataclasses.replace(
        thr,
        per_candidate=per,
        source=f"{thr.source}; pipeline model (sync and async)",
        notes=(*thr.notes, note),
    )


def pick_for(
    decision: JointDecision, label: str, *, mini_batches: int, sync_every: int, total_gpus: int = 1
) -> AsyncPick | None:
    """How to run ``label`` (the main ranking's winner): its best row, and for an async one the best
    modelled split of the cluster where the decision ranked one; None when it has no row."""
    row = next((r for r in decision.rows if r.label == label), None)
    if row is None:
        return None
    ch = row.choice
    sync = ch.mode == "sync"
    splits = decision.splits
    on = splits.best_for(label) if splits is not None and not sync else None
    if splits is not None and on is not None and on.choice.rollout_gpus is not None:
        ch, total_gpus = on.choice, splits.total_gpus  # the cluster's modelled split, and its cap
    split = not sync and total_gpus > 1
    return AsyncPick(
        label=label,
        mode=ch.mode,
        staleness=ch.staleness,
        updates_per_batch=ch.updates_per_batch,
        mini_batches=mini_batches,
        sync_every=1 if sync else sync_every,
        in_flight_cap=0 if sync else queue_cap(ch.in_flight_cap),
        rollout_gpus=ch.rollout_gpus if split else None,
        train_gpus=total_gpus - (ch.rollout_gpus or 0) if split else None,
        total_gpus=total_gpus,
    )
