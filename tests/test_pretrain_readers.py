"""What the readers of a pre-training grid's results (report, recommend) tell a user to do."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.measure.probe import check_manifest
from batchtune.recipe.load import load_recipe, shipped_recipes
from batchtune.records.store import ResultsStore

GRID = str(shipped_recipes()["tiny-pretrain"])


def _grid_dir(tmp_path: Path) -> Path:
    res = tmp_path / "grid"
    check_manifest(ResultsStore(res), load_recipe(GRID, [f"run.results_dir={res}"]))
    return res


def test_report_of_a_grid_names_the_probe_to_rerun_not_a_set_it_lacks(tmp_path: Path):
    res = _grid_dir(tmp_path)
    out = CliRunner().invoke(app, ["report", str(res)])
    assert out.exit_code == 2, out.output
    msg = " ".join(out.stderr.split())
    assert "--set probe.mode" not in msg  # report takes no --set
    assert f"batchtune probe {GRID} --results {res}" in msg


def test_recommend_of_a_grid_still_offers_its_set(tmp_path: Path):
    res = _grid_dir(tmp_path)
    out = CliRunner().invoke(app, ["recommend", GRID, "-r", str(res)])
    assert out.exit_code == 2, out.output
    assert "--set probe.mode=branched" in " ".join(out.stderr.split())


def test_smoke_of_a_branched_pretraining_recipe_does_not_call_it_a_grid(tmp_path: Path):
    from batchtune.recipe.smoke import smoke_recipe

    for name, word in (("tiny-pretrain-branched", "batchtune tune"), ("tiny-pretrain", "grid analysis")):
        plan = smoke_recipe(load_recipe(str(shipped_recipes()[name])), str(tmp_path))
        assert word in plan.skip["recommend"], (name, plan.skip)


def test_a_target_below_the_datas_loss_floor_is_refused_before_any_run(tmp_path: Path):
    """It used to run every batch to its budget, then exit 3 "give higher target losses or longer
    runs": no run is long enough to reach a loss under the synthetic data's exact Bayes loss."""
    res = tmp_path / "r"
    for command in ("probe", "plan"):
        out = CliRunner().invoke(app, [command, GRID, "-r", str(res), "--set", "pretrain.targets=[2.0, 1.0]"])
        assert out.exit_code == 2, out.output
        assert "pretrain.targets: 1 at or below the data's loss floor 1.5226" in " ".join(out.stderr.split())
        assert not res.exists()


def test_the_branched_probe_refuses_a_target_below_the_loss_floor_too(tmp_path: Path):
    """The branched probe (and `tune` of it) ran its trunk and branches to their budgets, exit 0, for
    a target no run can reach; `plan` of it printed a cost and "Run it"."""
    res = tmp_path / "r"
    branched = str(shipped_recipes()["tiny-pretrain-branched"])
    for command in ("probe", "plan", "tune"):
        out = CliRunner().invoke(app, [command, branched, "-r", str(res), "--set", "pretrain.targets=[1.5]"])
        assert out.exit_code == 2, (command, out.output)
        said = " ".join(out.stderr.split())
        assert "pretrain.targets: 1.5 at or below the data's loss floor 1.5226" in said, command
        assert not res.exists()


def test_a_damaged_manifest_says_what_to_do(tmp_path: Path):
    """It said only "manifest.json is not valid JSON: Expecting ...", and not that the finished runs
    survive deleting it."""
    res = tmp_path / "r"
    res.mkdir()
    (res / "manifest.json").write_text('{"recipe": ')
    out = CliRunner().invoke(app, ["probe", GRID, "-r", str(res)])
    assert out.exit_code == 2, out.output
    said = " ".join(out.stderr.split())
    assert "manifest.json is not valid JSON" in said
    assert "delete it and run the probe again with the recipe it ran: its finished runs are kept" in said
