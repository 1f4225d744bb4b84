"""Branched probes at several staleness k (issue 30 item 3): off-policy branches from the trunk's
checkpoint at the candidate batch, paired with its k = 0 branch, stored, resumed, ranked."""

from __future__ import annotations

from pathlib import Path

from batchtune.measure.branch_checkpoint import branch_id
from batchtune.measure.branched import branched_store, run_branched_probe
from batchtune.recipe.load import load_recipe
from batchtune.workflow.recommend import recommend_for_recipe

SETS = [
    "probe.mode=branched",
    "branch.trunk_samples=1024",
    "branch.window_samples=512",
    "branch.checkpoints=[0.5, 1.0]",
    "candidates.prompts=[1, 4, 16]",
    "budget.seeds=[0, 1]",
]


def _recipe(tmp: Path, *more: str):
    return load_recipe("recipes/nqm.toml", [*SETS, *more, f"run.results_dir={tmp}"])


def test_branches_at_k_0_and_2_run_are_stored_resumed_and_ranked(tmp_path: Path) -> None:
    cfg = _recipe(tmp_path, "probe.staleness=[0, 2]")
    first = run_branched_probe(cfg)
    off = first.runs.offpolicy
    assert off is not None and off.checkpoint == first.runs.checkpoints[-1]
    label = f"{off.base}-k2u1"
    # every seed its on-policy batch was branched at (planned, and any confirmation seed)
    seeds = set(off.ratios[label])
    assert set(off.ratios) == {label} and seeds >= {0, 1}
    store = branched_store(tmp_path)
    cand = first.plan.by_label()[label]
    for s in seeds:
        rec = store.run(branch_id(off.checkpoint, cand, s))
        assert rec is not None and store.is_finished(rec.run_id) and rec.staleness == 2
    assert all(r > 0 for r, _ in off.ratios[label].values())
    est = first.efficiency.get(label)
    assert est.family == "offpolicy" and est.estimate is not None and est.samples_consumed == off.samples
    # resumed: nothing rerun, the same ratios read back
    again = run_branched_probe(cfg)
    assert again.runs_done == 0 and again.runs.offpolicy == off
    # the async ranking reads them as it reads a grid sweep's
    rec, _, _ = recommend_for_recipe(cfg, "probe", None, 1, plot=False)
    assert rec.async_decision is not None
    assert label in {row.label for row in rec.async_decision.rows}


def test_a_recipe_without_async_knobs_plans_the_same_branches(tmp_path: Path) -> None:
    sync = run_branched_probe(_recipe(tmp_path / "sync"))
    assert sync.runs.offpolicy is None and not sync.plan.offpolicy
    stale = run_branched_probe(_recipe(tmp_path / "stale", "probe.staleness=[0, 2]"))
    ids = {r.run_id for r in branched_store(tmp_path / "sync").runs()}
    assert not any("-k" in rid for rid in ids)
    on_policy = {r.run_id for r in branched_store(tmp_path / "stale").runs() if "-k" not in r.run_id}
    assert on_policy == ids  # off-policy branches only add to the on-policy ones
    assert stale.summary.locals == sync.summary.locals
