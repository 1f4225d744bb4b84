"""Issue 33 item 1 at the probe: a planted checkpoint stops the probe in one line (exit 2) naming
the file, its code never runs, and the runs that were to start from it are not sealed as failed
(that read as the batch failing, or as "no finished control branch", exit 3). A trunk checkpoint
that was deleted is named too, before any branch is sealed from it."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.errors import InputError, UnsafeCheckpoint
from batchtune.measure.branched import branched_recipe, branched_store, run_branched_probe
from batchtune.measure.one_run import execute_run
from batchtune.measure.plan import plan_candidates
from batchtune.measure.stop_rule import StopPolicy
from batchtune.recipe.load import load_recipe, shipped_recipes

BRANCHED = str(shipped_recipes()["tiny-pretrain-branched"])
SMALL = ["pretrain.seq_len=8", "pretrain.batches_tokens=[8, 16, 32]", "lr_scaling.reference_batch=8",
         "pretrain.max_tokens=2048", "pretrain.eval_every_tokens=32", "pretrain.eval_sequences=16",
         "pretrain.warmup_tokens=0", "pretrain.targets=[3.0]", "branch.trunk_samples=512",
         "branch.checkpoints=[0.5, 1.0]", "branch.window_samples=128", "branch.min_steps=2",
         "budget.seeds=[0, 1]", "branch.confirm_seeds=2", "branch.max_seeds=2"]  # fmt: skip


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def plant(file: Path, marker: Path) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": _Payload(marker), "seed": 0}, file)


def test_a_run_from_a_planted_checkpoint_stops_unsealed_and_nothing_runs(tmp_path: Path):
    recipe = branched_recipe(load_recipe(BRANCHED, SMALL))
    results, marker = tmp_path / "r", tmp_path / "ran"
    ckpt = results / "checkpoints" / "ckpt-256"
    plant(ckpt / "state.pt", marker)
    plan = plan_candidates(recipe)
    cand, t = plan.by_label()["B16"], recipe.target
    policy = StopPolicy(t.metric, t.value, t.higher_is_better, t.ema_alpha, 512, True, math.inf, 256)
    with pytest.raises(
        UnsafeCheckpoint, match=r"refused the checkpoint .*ckpt-256.state\.pt.*could run code"
    ):
        execute_run(recipe, str(results), cand, 0, recipe.optimizer.lr, plan.reference_batch, policy,
                    rid="c256-B16-s0", spec_extra={"resume_from": str(ckpt)})  # fmt: skip
    assert not marker.exists()
    assert not (results / "runs" / "c256-B16-s0" / "run.json").exists()  # not sealed as "failed"


NQM = ["probe.mode=branched", "branch.trunk_samples=1024", "branch.window_samples=512",
       "branch.checkpoints=[0.5, 1.0]", "candidates.prompts=[1, 8, 32, 64, 128]",
       "budget.seeds=[0, 1]"]  # fmt: skip


def test_a_deleted_trunk_checkpoint_is_named_before_a_branch_is_sealed_from_it(tmp_path: Path):
    recipe = load_recipe("recipes/nqm.toml", [*NQM, f"run.results_dir={tmp_path}"])
    run_branched_probe(recipe)
    store = branched_store(tmp_path)
    (store.root / "checkpoints" / "ckpt-512.npz").unlink()
    branches = [r.run_id for r in store.runs("c512-") if r.candidate != "P1xG8"]  # not the controls
    assert branches
    for rid in branches:
        shutil.rmtree(store.run_dir(rid))
    with pytest.raises(InputError, match=r"the trunk's checkpoint .*ckpt-512 is missing, and the run c512-P"):
        run_branched_probe(recipe)
    assert not any(store.is_finished(rid) for rid in branches)  # none sealed as failed


@pytest.mark.slow  # a branched pre-training probe of the tiny LM, then its resume: ~15-40 s on 2 cores
def test_a_probe_resumed_over_a_planted_checkpoint_stops_in_one_line(tmp_path: Path):
    results, marker = tmp_path / "r", tmp_path / "ran"
    cmd = ["probe", BRANCHED, "-r", str(results), *[a for s in SMALL for a in ("--set", s)]]
    first = CliRunner().invoke(app, cmd)
    assert first.exit_code == 0, first.output
    store = branched_store(results)
    ckpt = store.root / "checkpoints" / "ckpt-256" / "state.pt"
    assert ckpt.is_file()
    plant(ckpt, marker)  # the trunk's first checkpoint, replaced by the payload
    for rec in store.runs("c256-"):  # its branches and controls, to be run again from the file
        shutil.rmtree(store.run_dir(rec.run_id))
    again = CliRunner().invoke(app, cmd)
    assert again.exit_code == 2, again.output
    assert "refused the checkpoint" in again.output and "could run code" in again.output
    assert "Traceback" not in again.output and not marker.exists()
    assert store.runs("c256-") == []  # nothing sealed as failed from it
