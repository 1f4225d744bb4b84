"""The async and off-policy part of `recommend` (issue 30 item 5): what the probe's runs recorded about
how they ran (staleness, updates per batch, weight-sync seconds), handed to the pure joint decision
(analysis/decide/async_joint.py). Only a recipe with such a knob (``has_async_knobs``) comes here:
the default sync path never imports the async machinery.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from typing import TYPE_CHECKING

from batchtune.recipe.schema import Recipe
from batchtune.records import FAILED_STATUSES, ResultsStore

if TYPE_CHECKING:
    from batchtune.analysis.decide.async_joint import Knobs
    from batchtune.analysis.decide.async_rank import JointDecision
    from batchtune.analysis.decide.recommend import Recommendation, ThroughputModel
    from batchtune.analysis.sample.efficiency import SampleEfficiency


def has_async_knobs(cfg: Recipe) -> bool:
    """Whether ``cfg`` runs anything but synchronous on-policy training: a staleness k > 0, updates
    per batch other than its mini-batches, or the two-process mode."""
    p, m = cfg.probe, cfg.algorithm.mini_batches
    return (
        cfg.algorithm.mode == "async"
        or any(k != 0 for k in p.staleness)
        or any(u != m for u in p.updates_per_batch)
        or p.async_sweep == "auto"
    )


def run_knobs(store: ResultsStore) -> dict[str, Knobs]:
    """Per candidate: the staleness and updates per batch its runs recorded, and the median seconds
    of one weight sync over the steps that synced (0 when none did: one process)."""
    from batchtune.analysis.decide.async_joint import Knobs

    first: dict[str, Knobs] = {}
    syncs: dict[str, list[float]] = defaultdict(list)
    for rec in store.runs():
        if rec.status in FAILED_STATUSES:
            continue
        first.setdefault(rec.candidate, Knobs(rec.staleness, rec.updates_per_batch))
        for step in store.steps(rec.run_id):
            s = step.metrics.get("sync_s", 0.0)
            if s > 0:
                syncs[rec.candidate].append(s)
    return {
        lab: dataclasses.replace(kn, sync_s=statistics.median(syncs[lab]) if syncs[lab] else 0.0)
        for lab, kn in first.items()
    }


def joint_for(
    cfg: Recipe, store: ResultsStore, eff: SampleEfficiency, thr: ThroughputModel
) -> tuple[JointDecision, ThroughputModel]:
    """The joint decision over the store's runs, and the throughput model the main ranking then uses."""
    from batchtune.analysis.decide.async_joint import joint_decision, joint_throughput

    a = cfg.algorithm
    two = a.mode == "async"
    decision = joint_decision(
        eff,
        thr,
        run_knobs(store),
        mini_batches=a.mini_batches,
        two_process=two,
        sync_every=a.sync_every if two else 1,
    )
    return decision, joint_throughput(thr, decision)


def with_pick(rec: Recommendation, decision: JointDecision, cfg: Recipe) -> Recommendation:
    """``rec`` carrying the decision and how to run its winner."""
    from batchtune.analysis.decide.async_joint import pick_for

    a = cfg.algorithm
    pick = pick_for(
        decision,
        rec.winner.label,
        mini_batches=a.mini_batches,
        sync_every=a.sync_every if a.mode == "async" else 1,
    )
    return dataclasses.replace(rec, async_decision=dataclasses.replace(decision, pick=pick))
