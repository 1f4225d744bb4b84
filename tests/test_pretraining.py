"""`batchtune pretrain` on curves generated from known McCandlish parameters."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from batchtune.cli import app

BATCHES = [2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6]


def s_min(loss):
    return 100.0 * np.exp(2.0 * (4.0 - loss))


def b_crit(loss):
    return 1e5 * np.exp(1.5 * (4.0 - loss))


def _write(path, rng):
    """Loss curves whose steps to reach every loss L are S_min(L) (1 + B_crit(L) / B)."""
    levels = np.linspace(4.0, 2.6, 80)
    rows = ["run,batch_tokens,step,loss"]
    for b in BATCHES:
        steps_at = s_min(levels) * (1 + b_crit(levels) / b)
        for step in np.unique(np.geomspace(1, steps_at[-1], 150).round()):
            loss = np.interp(step, steps_at, levels) * (1 + rng.normal(0, 0.0005))
            rows.append(f"B{int(b)},{b},{step},{loss}")
    path.write_text("\n".join(rows) + "\n")


def test_recovers_critical_batch_per_target_loss(tmp_path):
    log = tmp_path / "runs.csv"
    _write(log, np.random.default_rng(0))
    out = CliRunner().invoke(app, ["pretrain", str(log), "--targets", "3.5,3.0", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    for fit in data["fits"]:
        loss = fit["target_loss"]
        assert fit["hyperbola"]["b_crit_tokens"] == pytest.approx(b_crit(loss), rel=0.15)
        assert fit["hyperbola"]["s_min_steps"] == pytest.approx(s_min(loss), rel=0.15)
    # the critical batch rises as the target loss falls, and the schedule says so with its LRs
    sched = data["schedule"]
    assert [st["batch_tokens"] for st in sched] == sorted(st["batch_tokens"] for st in sched)
    assert sched[1]["lr"] > sched[0]["lr"]


def test_table_output_and_bad_input(tmp_path):
    log = tmp_path / "runs.csv"
    _write(log, np.random.default_rng(1))
    out = CliRunner().invoke(app, ["pretrain", str(log)])
    assert out.exit_code == 0, out.output
    assert "B_crit" in out.output and "schedule" in out.output
    bad = tmp_path / "bad.csv"
    bad.write_text("run,batch_tokens,step,loss\na,1e5,1,x\n")
    out = CliRunner().invoke(app, ["pretrain", str(bad)])
    assert out.exit_code == 2 and "bad.csv:2" in out.output
