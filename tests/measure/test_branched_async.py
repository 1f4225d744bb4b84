"""Branched probes at several staleness k (issue 30 item 3): off-policy branches from the trunk's
checkpoint at the candidate batch, paired with its k = 0 branch, stored, resumed, ranked."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from batchtune.measure.branch_checkpoint import branch_id
from batchtune.measure.branched import branched_store, run_branched_probe
from batchtune.measure.preview_branched import branched_plan_preview
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
    plan = branched_plan_preview(cfg, 0)
    first = run_branched_probe(cfg)
    off = first.runs.offpolicy
    # the plan's bound holds: the off-policy branches spent no more than it said, the probe neither
    assert off is not None and 0 < off.samples <= plan.offpolicy_samples_max
    assert first.summary.probe_samples <= plan.total_samples_max
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


def test_plan_shows_the_off_policy_branches_cost_in_its_totals(tmp_path: Path) -> None:
    """`plan` of a branched recipe with staleness knobs counts the off-policy branches (runs,
    samples, seconds) before anything runs, in the text and in --json; a sync recipe has none."""
    import json

    from typer.testing import CliRunner

    from batchtune.cli.app import app

    sync = branched_plan_preview(_recipe(tmp_path / "s"), 0)
    stale = branched_plan_preview(_recipe(tmp_path / "k", "probe.staleness=[0, 1, 2]"), 0)
    assert sync.offpolicy == () and sync.offpolicy_samples_max == 0
    assert [c.cell for c in stale.offpolicy] == ["k1u1", "k2u1"]
    seeds_max = stale.seeds_max
    for c in stale.offpolicy:
        # a branch per seed at the most seeds, each to the longest branch of the dearest batch (here
        # the reference's and P16's: 2 windows of 512)
        assert c.runs_max == seeds_max and c.longest_samples == 1024 and c.batches == 3
    assert stale.offpolicy_samples_max == 2 * seeds_max * 1024
    assert stale.total_samples_max == sync.total_samples_max + stale.offpolicy_samples_max
    args = [a for s in [*SETS, "probe.staleness=[0, 2]"] for a in ("--set", s)]
    base = ["plan", "recipes/nqm.toml", "-r", str(tmp_path / "cli"), *args, "--time-steps", "1"]
    out = CliRunner().invoke(app, [*base, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert [c["cell"] for c in data["offpolicy"]] == ["k2u1"] and data["offpolicy_s_max"] > 0
    text = CliRunner().invoke(app, base).stdout
    assert "Off-policy branches (cell: runs x samples at most): k2u1" in text


def test_offpolicy_read_target_runs_the_branches_and_a_k0_beside_them_to_the_target(tmp_path: Path) -> None:
    """branch.offpolicy_read = "target": each off-policy branch and a k = 0 branch of the same batch
    and seed run from the checkpoint to the target itself, read there (not at the window's level);
    the plan bounds what they spend, counting the k = 0 branches as a "k0" cell."""
    cfg = _recipe(tmp_path, "probe.staleness=[0, 2]", "branch.offpolicy_read=target")
    plan = branched_plan_preview(cfg, 0)
    assert [c.cell for c in plan.offpolicy] == ["k0", "k2u1"]
    assert all(c.longest_samples == cfg.budget.max_samples for c in plan.offpolicy)
    res = run_branched_probe(cfg)
    off = res.runs.offpolicy
    assert off is not None and off.level == cfg.target.value
    assert 0 < off.samples <= plan.offpolicy_samples_max
    store = branched_store(tmp_path)
    base = res.plan.by_label()[off.base]
    for s in off.ratios[f"{off.base}-k2u1"]:
        rec = store.run(branch_id(off.checkpoint, dataclasses.replace(base, label=f"{off.base}-k0"), s))
        assert rec is not None and store.is_finished(rec.run_id) and rec.staleness == 0
        # the k = 0 branch ran past the window's level, to the target (or its cap)
        assert rec.samples - off.checkpoint > cfg.branch.window_samples * cfg.branch.max_window_factor
    rec2, _, _ = recommend_for_recipe(cfg, "probe", None, 1, plot=False)
    assert rec2.async_decision is not None
