"""import-logs into a results directory a probe made: the probe's manifest is the recipe its next run
is checked against (measure/probe.check_manifest), so an import never rewrites it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.recipe.load import shipped_recipes
from batchtune.records.store import ResultsStore


def _probe(res) -> list[str]:
    args = ["probe", str(shipped_recipes()["nqm"]), "-r", str(res), "--json"]
    for s in ("candidates.prompts=[1,4]", "budget.seeds=[0]", "budget.max_samples=2048", "target.value=3.0"):
        args += ["--set", s]
    return [*args, "--set", "nqm.dim=100"]


def _import(tmp_path, res, name: str, *extra: str):
    log = tmp_path / f"{name}.csv"
    rows = [f"{s},{16 * s},{3.7 - 0.1 * s:.2f},0.06\n" for s in range(0, 8)]
    log.write_text("step,samples,loss,lr\n" + "".join(rows))
    args = ["import-logs", str(log), "--format", "csv", "-r", str(res), "--prompts", "2", "--group-size", "8"]
    return CliRunner().invoke(app, [*args, *extra])


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--target", "3.2"], "target.value 3.0 -> 3.2"),
        (["--metric", "sim_train_loss"], "target.metric 'loss' -> 'sim_train_loss'"),
        (["--set", "target.tolerance=0.3"], "target.tolerance 0.1 -> 0.3"),
    ],
)
def test_target_options_that_differ_from_a_probes_are_refused_and_it_resumes(tmp_path, options, says):
    """An import given a target other than the probe's rewrote its manifest, and the same probe was
    then refused (exit 2, "changed: target.value"). The import is refused instead, before anything
    is written, saying how to judge by that target (recommend's --set) or where to import instead."""
    res = tmp_path / "res"
    probe = _probe(res)
    assert CliRunner().invoke(app, probe).exit_code == 0
    store = ResultsStore(res)
    before, n_runs = store.read_manifest(), len(store.runs())
    out = _import(tmp_path, res, "mine", *options)
    assert out.exit_code == 2, out.output
    (line,) = out.stderr.strip().splitlines()
    assert says in line and "batchtune recommend --results" in line and "another --results" in line
    assert store.read_manifest() == before and len(store.runs()) == n_runs
    out = CliRunner().invoke(app, probe)
    assert out.exit_code == 0, out.output


def test_target_options_that_agree_with_a_probes_import_and_leave_it_as_it_was(tmp_path):
    res = tmp_path / "res"
    probe = _probe(res)
    assert CliRunner().invoke(app, probe).exit_code == 0
    store = ResultsStore(res)
    before, n_runs = store.read_manifest(), len(store.runs())
    out = _import(tmp_path, res, "mine", "--metric", "loss", "--target", "3", "--lower-is-better", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["added"] == ["mine"]
    assert store.read_manifest() == before and len(store.runs()) == n_runs + 1
    out = CliRunner().invoke(app, probe)
    assert out.exit_code == 0, out.output
    refused = _import(tmp_path, res, "other", "--seed", "1", "--target", "3.2")
    assert f"`batchtune recommend --results {res} --set target.value=3.2`" in refused.stderr
    judged = CliRunner().invoke(app, ["recommend", "--results", str(res), "--set", "target.value=3.2"])
    assert judged.exit_code == 0 and "loss <= 3.2" in judged.output, judged.output
    assert store.read_manifest() == before
