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
