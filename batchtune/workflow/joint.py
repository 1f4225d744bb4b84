"""The async and off-policy part of `recommend` (issue 30 item 5): what the probe's runs recorded about
how they ran (staleness, updates per batch, weight-sync seconds), handed to the pure joint decision
(analysis/decide/async_joint.py). Only a recipe with such a knob (``has_async_knobs``) comes here:
the default sync path never imports the async machinery.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from batchtune.measure.async_sweep import stored_traces
from batchtune.measure.async_topup import run_knobs
from batchtune.measure.topup_record import load_top_up
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore
from batchtune.records.types import on_policy_updates

if TYPE_CHECKING:
    from batchtune.analysis.decide.async_rank import JointDecision
    from batchtune.analysis.decide.recommend import Recommendation, ThroughputModel
    from batchtune.analysis.sample.efficiency import SampleEfficiency

__all__ = ["joint_for", "with_pick"]


def joint_for(
    cfg: Recipe, store: ResultsStore, eff: SampleEfficiency, thr: ThroughputModel, gpus: int = 0
) -> tuple[JointDecision, ThroughputModel]:
    """The joint decision over the store's runs, and the throughput model the main ranking then uses;
    ``gpus`` >= 2: the rollout:train splits of that many GPUs modelled too (`recommend --gpus`). The
    async runs of each batch shape are ranked against its on-policy runs stored under a plain label,
    at their u (an import's PPO runs at u = 4, though its recipe says algorithm.mini_batches = 1; P16
    at u = 4 beside P4 at u = 1 where verl's ppo_mini_batch_size was fixed)."""
    from batchtune.analysis.decide.async_joint import joint_decision, joint_throughput

    a = cfg.algorithm
    two = a.mode == "async"
    runs = store.runs()
    decision = joint_decision(
        eff,
        thr,
        run_knobs(store),
        mini_batches=a.mini_batches,
        two_process=two,
        sync_every=a.runs_sync_every,
        cluster_gpus=gpus,
        traces=stored_traces(store),
        on_policy_u=on_policy_updates(runs),
    )
    rec = load_top_up(store)  # what the probe's seed top-up ran, why, and where it stopped
    if rec is not None:  # of the candidates ranked here only (a recipe edited to drop some keeps it)
        ranked = {row.label for row in decision.rows}
        notes = rec.lines(ranked, with_runs={r.candidate for r in runs})
        end = rec.end_for(ranked)
        decision = dataclasses.replace(decision, notes=(*decision.notes, *notes), top_up_end=end)
    return decision, joint_throughput(thr, decision)


def with_pick(rec: Recommendation, decision: JointDecision, cfg: Recipe) -> Recommendation:
    """``rec`` carrying the decision and how to run its winner."""
    from batchtune.analysis.decide.async_joint import pick_for

    a = cfg.algorithm
    pick = pick_for(
        decision,
        rec.winner.label,
        mini_batches=a.mini_batches,
        sync_every=a.runs_sync_every,
    )
    end = decision.top_up_end  # a near tie the probe's seeds left open is thin evidence for the pick
    tie = "" if end is None else end.near_tie(rec.winner.label)
    evidence = (*rec.evidence, tie) if tie else rec.evidence
    return dataclasses.replace(
        rec, async_decision=dataclasses.replace(decision, pick=pick), evidence=evidence
    )
