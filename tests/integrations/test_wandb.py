"""W&B CSV exports, in both shapes W&B produces: a chart panel's download and a run's history."""

from __future__ import annotations

import pytest

from batchtune.errors import InputError
from batchtune.integrations.common import RunInfo
from batchtune.integrations.readers import read_log

HEADER = [
    "Step",
    "grpo-64 - critic/score/mean",
    "grpo-64 - critic/score/mean__MIN",
    "grpo-64 - critic/score/mean__MAX",
    "grpo-128 - critic/score/mean",
]
PANEL = (
    ",".join(HEADER)
    + """
1,0.10,0.10,0.10,0.12
2,0.20,0.20,0.20,
3,0.30,0.30,0.30,0.35
"""
)

HISTORY = """_step,_runtime,_timestamp,train/reward,train/actor_lr,train/actor_grad_norm,note
1,12.0,1700000012,0.1,5e-7,2.0,start
2,22.0,1700000022,0.2,5e-7,1.5,
3,34.0,1700000034,0.3,5e-7,1.0,end
"""


def test_panel_export_one_run_per_name(tmp_path):
    path = tmp_path / "panel.csv"
    path.write_text(PANEL)
    runs = {r.run_id: r for r in read_log(path, "wandb", RunInfo(prompts=64, group_size=8, lr=1e-6))}
    assert sorted(runs) == ["grpo-128", "grpo-64"]
    small = runs["grpo-64"]
    assert [s.samples for s in small.steps] == [512, 1024, 1536]
    assert [s.metrics["reward"] for s in small.steps] == [0.1, 0.2, 0.3]  # critic/score/mean
    assert "critic/score/mean__MIN" not in small.steps[0].metrics
    assert [s.step for s in runs["grpo-128"].steps] == [1, 3]  # empty cells are missing values


def test_history_export(tmp_path):
    path = tmp_path / "history.csv"
    path.write_text(HISTORY)
    (run,) = read_log(path, "wandb", RunInfo(prompts=16, group_size=4, run_id="r1"))
    assert run.run_id == "r1" and run.lr == pytest.approx(5e-7)
    assert [s.metrics["reward"] for s in run.steps] == [0.1, 0.2, 0.3]
    assert [s.grad_norm for s in run.steps] == [2.0, 1.5, 1.0]
    assert [s.other_s for s in run.steps] == [0.0, 10.0, 12.0]  # from _runtime


def test_wandb_errors(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("Step,run - train/reward\n1,0.1\n2,oops\n")
    with pytest.raises(InputError, match=r"bad\.csv:3: column 'run - train/reward': 'oops'"):
        read_log(path, "wandb", RunInfo(prompts=4, group_size=4, lr=1e-6))
    path.write_text("time,train/reward\n1,0.1\n")
    with pytest.raises(InputError, match=r"bad\.csv:1: no step column"):
        read_log(path, "wandb", RunInfo(prompts=4, group_size=4, lr=1e-6))
