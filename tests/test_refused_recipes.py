"""Issue 33 item 5: a refused recipe leaves nothing behind, so the corrected one is accepted.

A bad ``lr_scaling.table`` key is found by the planner: it used to be found after the manifest was
written, and the corrected recipe was then "a different recipe". ``target.tolerance = 1e-300``
passed the range check, ran every run and crashed (exit 70); the range check refuses it up front.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.measure.probe import check_manifest
from batchtune.recipe.load import load_recipe, shipped_recipes
from batchtune.records.store import ResultsStore

NQM = str(shipped_recipes()["nqm"])


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ('lr_scaling.table={"abc" = 1e-3}', "lr_scaling.table: key 'abc'"),
        ("target.tolerance=1e-300", "target.tolerance: 1e-300"),
    ],
)
def test_a_refused_recipe_writes_nothing_and_the_corrected_one_is_accepted(tmp_path: Path, bad, fragment):
    res = tmp_path / "res"
    out = CliRunner().invoke(app, ["probe", NQM, "-r", str(res), "--set", bad])
    err = out.stderr.strip().splitlines()
    assert out.exit_code == 2, (out.exit_code, out.stderr[-300:])
    assert len(err) == 1 and fragment in err[0], err
    assert not res.exists(), "no manifest, no runs"
    fixed = load_recipe(NQM, [f"run.results_dir={res}"])  # the same recipe without the mistake
    check_manifest(ResultsStore(res), fixed)
    check_manifest(ResultsStore(res), fixed)  # and it is the directory's recipe from then on
    assert (res / "manifest.json").is_file()


@pytest.mark.parametrize("tol", ["1e-300", "0.0001", "0"])
def test_a_tolerance_no_probe_can_resolve_is_out_of_range(tol):
    from batchtune.errors import RecipeError

    with pytest.raises(RecipeError, match="target.tolerance"):
        load_recipe(NQM, [f"target.tolerance={tol}"])
    assert load_recipe(NQM, ["target.tolerance=0.001"]).target.tolerance == 0.001


def test_a_reader_of_another_recipes_probe_is_told_to_give_it_not_to_delete(tmp_path: Path):
    """`recommend tiny-pretrain-branched -r DIR` on a probe run with --set: the message lists every
    changed key (the branches' too, else following it met a second error) and never says delete."""
    from batchtune.errors import InputError

    branched = str(shipped_recipes()["tiny-pretrain-branched"])
    sets = [f"run.results_dir={tmp_path}", "branch.trunk_samples=4096", "pretrain.targets=[2.6]"]
    ran = load_recipe(branched, sets)
    check_manifest(ResultsStore(tmp_path), ran)
    shipped = load_recipe(branched, [f"run.results_dir={tmp_path}"])
    with pytest.raises(InputError) as exc:
        check_manifest(ResultsStore(tmp_path), shipped, read_only=True)
    msg = str(exc.value)
    assert "branch.trunk_samples" in msg and "pretrain.targets" in msg
    assert "leave the recipe out" in msg and "delete" not in msg
    with pytest.raises(InputError, match="delete it to start over"):  # a probe may start over
        check_manifest(ResultsStore(tmp_path), shipped)
