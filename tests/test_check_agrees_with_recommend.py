"""`check` passes the trainer config that `recommend --emit` wrote from the same evidence.

The new-user walkthrough (tiny-grpo): recommend picked 16 prompts x 8 = 128 responses per step, the
fastest predicted time-to-target, above the critical batch 32 (R/R0 1.46 at 3.31x the throughput);
check then failed that very file ("use at most 32"). The evidence is written down here as a
measurements file with the walkthrough's own numbers, so the test runs no training.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from batchtune.cli import app

CANDIDATES = [  # P, lr, samples to target [90% CI], responses/s: the walkthrough's recommend table
    (2, 0.0002, 3979, 3706, 4530, 341),
    (4, 0.000283, 4150, 3385, 4344, 567),
    (8, 0.0004, 4856, 4267, 5237, 849),
    (16, 0.000566, 5823, 5357, 6348, 1129),
    (32, 0.0008, 8464, 6858, 8562, 1353),
]


def write_measurements(path: Path) -> Path:
    lines = ['[study]\nname = "tiny-grpo walkthrough"\nmetric = "eval_reward"\nreference = "P2xG8"\n']
    for p, lr, r, lo, hi, rps in CANDIDATES:
        lines.append(
            f'[[candidate]]\nname = "P{p}xG8"\nprompts = {p}\ngroup_size = 8\nlr = {lr}\nlr_rule = "sqrt"\n'
            f"samples_to_target = {r}\nsamples_ci = [{lo}, {hi}]\nresponses_per_s = {rps}\n"
        )
    path.write_text("\n".join(lines))
    return path


def test_check_passes_the_config_recommend_emitted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    m = write_measurements(tmp_path / "m.toml")
    runner = CliRunner()
    rec = runner.invoke(
        app, ["recommend", "--measurements", str(m), "--emit", "verl", "--gpus", "16", "-o", "verl.txt"]
    )
    assert rec.exit_code == 0, rec.output
    assert "data.train_batch_size=16" in (tmp_path / "verl.txt").read_text()  # the pick: 128 responses
    res = runner.invoke(app, ["check", "verl.txt", "--measurements", str(m), "--json"])
    assert res.exit_code == 0, res.output
    checks = {c["name"]: c for c in json.loads(res.output)["checks"]}
    assert checks["batch"]["status"] == "pass", checks["batch"]
    assert "pick" in checks["batch"]["message"]
    assert checks["lr"]["status"] == "pass"
