"""A diverged imported run is a diverged run (issue 33, item 9): stored with status "diverged", said
so by `import-logs`, and left out of the ranking and of "could be up to ...x faster than the pick".
Before, it was "completed" and censored at its last step, so a run that blew up at its second step
bounded how much faster its batch could be."""

from __future__ import annotations

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.integrations.common import divergence
from batchtune.records.store import ResultsStore
from batchtune.records.types import StepRecord


def _steps(*values: float, grad: float | None = None) -> list[StepRecord]:
    return [
        StepRecord("r", i + 1, 8 * (i + 1), 0, 1e-4, 1, 8, 0, {"score": v}, grad_norm=grad)
        for i, v in enumerate(values)
    ]


def test_divergence_is_a_metric_that_turns_non_finite_and_stays_so():
    nan, inf = math.nan, math.inf
    assert divergence(_steps(0.1, 0.2, 0.3)) is None
    assert divergence(_steps(0.1, nan, nan)) == "score is nan from step 2 to the end of the log"
    assert divergence(_steps(0.1, inf)) == "score is inf from step 2 to the end of the log"
    assert divergence(_steps(0.1, nan, 0.3)) is None  # recovered: an fp16 loss-scale skip, not divergence
    assert divergence(_steps(nan, nan)) is None  # never finite: a column the log does not fill
    assert divergence(_steps(0.1, 0.2, grad=inf)) == "grad_norm is inf from step 1 to the end of the log"


def _sweep(path: Path) -> None:
    """Three seeds each of 8, 32 and 128 responses per step reaching score 0.8 (the reference needs
    ~640 responses), and one run at 512 whose score is nan from its second step."""
    rows = ["run,step,prompts,group_size,seed,lr,score,step_s"]
    for seed in (0, 1, 2):
        for p, rate, steps in ((1, 400, 300), (4, 420, 80), (16, 700, 30)):
            for step in range(1, steps + 1):
                score = 1 - math.exp(-step * p * 8 / rate) + 0.002 * (seed - 1)
                rows.append(f"P{p}s{seed},{step},{p},8,{seed},{1e-4 * p**0.5},{score:.4f},{0.5 + 0.05 * p}")
    rows += ["P64s0,1,64,8,0,0.0008,0.2,3.7", "P64s0,2,64,8,0,0.0008,nan,3.7"]
    path.write_text("\n".join(rows) + "\n")


def test_a_diverged_imported_run_is_reported_and_bounds_nothing(tmp_path: Path):
    log, results = tmp_path / "sweep.csv", tmp_path / "r"
    _sweep(log)
    args = ["import-logs", str(log), "--format", "csv", "--results", str(results), "--metric", "score"]
    out = CliRunner().invoke(app, [*args, "--target", "0.8"])
    assert out.exit_code == 0, out.output
    assert "diverged P64s0: score is nan from step 2" in " ".join(out.output.split())
    rec = ResultsStore(results).run("P64s0")
    assert rec is not None and rec.status == "diverged"
    out = CliRunner().invoke(app, ["recommend", "--results", str(results), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    pick = data["recommended"]
    assert pick["name"] == "P16xG8"
    assert pick["regret_against"] is None and pick["regret_high"] == 1.0  # before: P64xG8, 1.60x
    big = next(c for c in data["candidates"] if c["name"] == "P64xG8")
    assert big["rank"] is None and big["failures"] == [
        "seed 0: diverged (score is nan from step 2 to the end of the log)"
    ]


def test_the_reason_names_a_larger_batch_that_failed_instead_of_none_measured(tmp_path: Path):
    """docs/import-logs.md's sweep: the pick is the largest batch that ran to an estimate, and the
    one above it diverged. The reason used to say "No larger batch was measured in this sweep; a
    larger one may be faster still", beside a table that lists the larger batch as failed."""
    log, results = tmp_path / "sweep.csv", tmp_path / "r"
    _sweep(log)
    args = ["import-logs", str(log), "--format", "csv", "--results", str(results), "--metric", "score"]
    assert CliRunner().invoke(app, [*args, "--target", "0.8"]).exit_code == 0
    out = CliRunner().invoke(app, ["recommend", "--results", str(results), "--json"])
    assert out.exit_code == 0, out.output
    reason = json.loads(out.stdout)["recommended"]["reason"]
    assert "No larger batch was measured" not in reason
    assert "P64xG8" in reason and "failed" in reason
