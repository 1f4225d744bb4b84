"""`recommend --emit` on runs imported from trainer logs: the config carries the updates per rollout
batch u the runs were imported at (`import-logs --updates-per-batch`), and `check` prices the file it
wrote at the winner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.integrations.common import RunInfo
from batchtune.integrations.trainer_configs import read_trainer_config
from tests.integrations.test_async_logs import _verl_log


def _ppo_import(tmp_path: Path) -> str:
    """PPO logs at u = 4 (P4xG8 and P16xG8, two seeds each, no async run): the winner is P4xG8, and
    the recipe import-logs writes says 1 mini-batch."""
    from batchtune.workflow.imports import import_logs

    res = str(tmp_path / "res")
    for p in (4, 16):
        for seed in (0, 1):
            path = tmp_path / f"p{p}s{seed}.jsonl"
            path.write_text(_verl_log(tmp_path, fully_async=False).read_text())
            info = RunInfo(prompts=p, group_size=8, seed=seed, updates_per_batch=4)
            import_logs([path], "verl", res, info, metric="reward", target=0.3)
    return res


@pytest.mark.parametrize("trainer", ["verl", "trl", "openrlhf"])
def test_an_emitted_import_pick_keeps_the_runs_updates_per_batch(tmp_path, trainer):
    """The PPO runs were trained at u = 4; `recommend --emit` wrote one mini-batch and one epoch
    (verl ppo_mini_batch_size = train_batch_size and no ppo_epochs, TRL num_iterations 1, OpenRLHF no
    max_epochs): u = 1, and `check` of that file said nothing. It now writes u = 4 as one mini-batch
    x 4 epochs, says in the file that the log gives only the product, and checks back at P4xG8."""
    res = _ppo_import(tmp_path)
    out = tmp_path / f"{trainer}.cfg"
    run = CliRunner().invoke(app, ["recommend", "-r", res, "--emit", trainer, "-o", str(out)])
    assert run.exit_code == 0, run.output
    text = out.read_text()
    assert read_trainer_config(out, trainer).updates_per_batch == 4, text
    note = " ".join(line for line in text.splitlines() if "mini-batches x epochs" in line)
    assert "imported" in note and "1 mini-batch x 4 epochs" in note, text
    run = CliRunner().invoke(app, ["check", str(out), "-r", res, "--format", trainer, "--json"])
    assert run.exit_code == 0, run.output
    got = json.loads(run.stdout)
    assert {c["name"]: c["status"] for c in got["checks"]}["batch"] == "pass", got["checks"]
    assert "own pick, P4xG8" in next(c["message"] for c in got["checks"] if c["name"] == "batch")
    assert got["predicted_time_to_target"]["value"] == pytest.approx(6.0)  # P4xG8's: 3 steps of 2 s
    assert not any("evidence's pick is" in n for n in got["notes"]), got["notes"]  # u is the runs'


def test_check_says_when_a_config_trains_at_another_u_than_the_imported_runs(tmp_path):
    """A config at u = 1 against runs imported at u = 4: check priced it at P4xG8 and said nothing of
    u. It now notes that the evidence's pick ran 4 updates per batch."""
    res = _ppo_import(tmp_path)
    cfg = tmp_path / "u1.yaml"
    cfg.write_text(
        "\n".join(
            [
                "data.train_batch_size=4",
                "actor_rollout_ref.rollout.n=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.actor.optim.lr=1e-06",
                "trainer.n_gpus_per_node=8",
            ]
        )
        + "\n"
    )
    run = CliRunner().invoke(app, ["check", str(cfg), "-r", res, "--format", "verl", "--json"])
    assert run.exit_code == 0, run.output
    notes = json.loads(run.stdout)["notes"]
    assert any("1 update(s) per batch" in n and "4 update(s) per batch" in n for n in notes), notes
