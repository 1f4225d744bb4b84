"""probe.mode = "auto": grid or branched, decided once at load against the full run the recipe states."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.errors import RecipeError
from batchtune.measure.probe_size import TRUNK_SHARE, choose_probe, full_run_samples, resolved
from batchtune.recipe.load import load_recipe as _load_recipe
from batchtune.recipe.load import recipe_to_toml
from batchtune.recipe.schema import Recipe
from batchtune.recipe.study import StudyKind


def load_recipe(name: str, overrides: list[str] | None = None) -> Recipe:
    """A shipped recipe as the workflow loads it: probe.mode = "auto" resolved."""
    return resolved(_load_recipe(name, overrides or []))


def test_without_a_full_run_auto_is_the_grid_so_the_default_tune_is_unchanged() -> None:
    cfg = load_recipe("tiny-grpo")
    assert cfg.probe.mode == "grid" and cfg.study is StudyKind.RL_GRID
    assert "no full run stated" in cfg.probe_choice
    assert Recipe().study is StudyKind.RL_GRID  # built in code, unresolved: the same answer


def test_a_long_stated_run_gets_the_branched_probe_with_its_costs() -> None:
    cfg = load_recipe("nqm-long")
    assert cfg.probe.mode == "branched" and cfg.study is StudyKind.RL_BRANCHED
    assert cfg.probe_choice.startswith("auto chose branched")
    choice = choose_probe(cfg)
    assert choice.full_run_samples == 875 * 256
    assert choice.branched_samples_max < choice.grid_samples  # cheaper even at its bound


def test_a_trunk_over_a_quarter_of_the_run_keeps_the_grid() -> None:
    full = int(load_recipe("tiny-grpo").branch.trunk_samples / TRUNK_SHARE) - 8
    cfg = load_recipe("tiny-grpo", [f"budget.full_run_samples={full}"])
    assert cfg.probe.mode == "grid"
    assert "over 25% of the run" in cfg.probe_choice


def test_steps_count_at_the_stated_batch_or_the_middle_candidate() -> None:
    steps = ["budget.full_run_steps=10", "budget.full_run_batch=256"]
    assert full_run_samples(load_recipe("nqm", steps)) == 2560
    assert full_run_samples(load_recipe("tiny-grpo", ["budget.full_run_steps=10"])) == 640  # 16..256: 64
    assert full_run_samples(load_recipe("nqm", ["budget.full_run_samples=99"])) == 99


def test_an_explicit_mode_is_kept_and_a_pretraining_grid_stays_a_grid() -> None:
    cfg = load_recipe("nqm-long", ["probe.mode=grid"])
    assert cfg.probe.mode == "grid" and cfg.probe_choice == ""
    pre = load_recipe("tiny-pretrain", ["budget.full_run_samples=10000000"])
    assert pre.study is StudyKind.PRETRAIN_GRID and "B_opt" in pre.probe_choice


def test_the_choice_is_not_a_recipe_key() -> None:
    cfg = load_recipe("nqm-long")
    assert "probe_choice" not in cfg.to_dict()
    assert "probe_choice" not in recipe_to_toml(cfg)
    with pytest.raises(RecipeError, match="unknown key"):
        load_recipe("nqm", ["probe_choice=x"])


def test_plan_shows_the_choice_and_why(tmp_path: object) -> None:
    runner = CliRunner()
    args = ["plan", "nqm-long", "--time-steps", "0", "--results", str(tmp_path)]
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "Probe mode: auto chose branched" in text.output
    out = runner.invoke(app, [*args, "--json"])
    assert json.loads(out.stdout)["probe_choice"].startswith("auto chose branched")


def test_tune_weighs_the_probe_against_the_stated_run(tmp_path: object) -> None:
    args = ["tune", "nqm-long", "--results", str(tmp_path), "--set", "budget.seeds=[0]", "--json"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    cost = data["probe_cost"]
    assert cost["stated_full_run_samples"] == 875 * 256
    assert cost["ratio_to_stated_run"] == pytest.approx(cost["samples"] / (875 * 256))
    assert data["probe_choice"].startswith("auto chose branched")


def test_a_longer_stated_run_gets_proportionally_larger_branches_still_cheaper_than_the_grid() -> None:
    base = load_recipe("nqm-long")  # 875 steps at 256: the measured setting, the recipe's sizes
    assert (base.branch.trunk_samples, base.branch.window_samples) == (2048, 1024)
    for k in (2, 4, 8):
        cfg = load_recipe("nqm-long", [f"budget.full_run_steps={875 * k}", "branch.size_to_run=true"])
        assert cfg.probe.mode == "branched"
        assert cfg.branch.trunk_samples == 2048 * k and cfg.branch.window_samples == 1024 * k
        assert cfg.branch.checkpoints == base.branch.checkpoints  # the branch points keep their share
        choice = choose_probe(cfg)
        assert choice.trunk_samples == 2048 * k
        assert choice.branched_samples_max <= choice.grid_samples
        assert "sized to the run" in cfg.probe_choice and f"trunk {2048 * k:,} samples" in cfg.probe_choice


def test_sizes_never_shrink_below_the_recipe_and_the_knob_keeps_them() -> None:
    short = load_recipe("nqm-long", ["budget.full_run_steps=300", "branch.size_to_run=true"])  # shorter
    assert (short.branch.trunk_samples, short.branch.window_samples) == (2048, 1024)
    assert "the least auto uses" in short.probe_choice
    kept = load_recipe("nqm-long", ["budget.full_run_steps=3500", "branch.size_to_run=false"])
    assert kept.probe.mode == "branched"
    assert (kept.branch.trunk_samples, kept.branch.window_samples) == (2048, 1024)
    assert "branch.size_to_run = true sizes them" in kept.probe_choice
    default = load_recipe("nqm-long", ["budget.full_run_steps=3500"])  # off unless asked for
    assert (default.branch.trunk_samples, default.branch.window_samples) == (2048, 1024)
    grid = load_recipe("nqm-long", ["budget.full_run_steps=3500", "probe.mode=grid"])
    assert grid.branch.trunk_samples == 2048  # only auto sizes


def test_an_off_policy_sweep_keeps_the_grid_as_measured() -> None:
    """Branched at one checkpoint, staleness cells picked a candidate that never reaches the target
    in 2 of 12 NQM probes (benchmarks/out/branched_async.txt): auto keeps the grid and says why."""
    from batchtune.measure.probe_size import OFFPOLICY_REASON

    for knob in ("probe.staleness=[0, 2]", "probe.updates_per_batch=[1, 2]", "probe.async_sweep=auto"):
        cfg = load_recipe("nqm-long", [knob])
        assert cfg.probe.mode == "grid" and OFFPOLICY_REASON in cfg.probe_choice, knob
    import dataclasses

    two = _load_recipe("nqm-long", [])
    two = dataclasses.replace(two, algorithm=dataclasses.replace(two.algorithm, mode="async"))
    assert "two-process" in choose_probe(two).reason
    assert load_recipe("nqm-long").probe.mode == "branched"  # on-policy: unchanged
