"""TRL's trainer_state.json: a real one, written by trl.GRPOTrainer running 3 steps on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchtune.backends.spec import Candidate, RunSpec
from batchtune.errors import InputError
from batchtune.integrations.readers import read_log
from batchtune.integrations.trl import find_trainer_state, read_trl_state, trl_run_info
from batchtune.recipe.load import load_recipe

pytest.importorskip("trl")

TINY = [
    "backend.training=trl",
    "model.pretrain_steps=20",
    "model.pretrain_batch=16",
    "task.difficulty=1",
    "task.train_size=40",
    "task.eval_size=4",
    "generation.max_new_tokens=3",
    "budget.max_samples=24",
    "candidates.group_size=4",
    "hardware.device=cpu",
]


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    """Run TRL's GRPOTrainer for real: P=2 x G=4, 3 optimiser steps, seed 0."""
    from batchtune.backends.trl_backend import TRLBackend

    root = tmp_path_factory.mktemp("trl")
    recipe = load_recipe(None, TINY)
    cand = Candidate("P2xG4", 2, 4, 1e-3, "sqrt")
    spec = RunSpec("P2xG4-s0", cand, 0, recipe, root / "runs" / "P2xG4-s0", 1e-3, 8)
    records = list(TRLBackend().train(spec))
    return spec.run_dir / "trl", records


def test_real_trainer_state_reads_back(trl_run):
    out_dir, records = trl_run
    state = json.loads((out_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and {"reward", "grad_norm", "learning_rate"} <= set(
        state["log_history"][0]
    )
    info = trl_run_info(num_generations=4, per_device_train_batch_size=8, lr=0.0, seed=0, run_id="imported")
    run = read_trl_state(out_dir, info)
    assert (run.prompts, run.group_size, run.candidate) == (2, 4, "P2xG4")
    assert [s.samples for s in run.steps] == [8, 16, 24]  # 8 completions per optimiser step
    trained = [r for r in records if r.step > 0]
    assert [s.metrics["reward"] for s in run.steps] == pytest.approx([r.metrics["reward"] for r in trained])
    assert [s.grad_norm for s in run.steps] == pytest.approx([r.grad_norm for r in trained])
    assert [s.lr for s in run.steps] == pytest.approx([1e-3] * 3) and run.lr == pytest.approx(1e-3)
    assert all(s.tokens > 0 for s in run.steps)  # completions/mean_length * completions
    assert run.steps[0].train_s > 0 and run.steps[0].other_s == 0  # TRL step_time: the whole step
    assert read_log(out_dir / "trainer_state.json", "trl", info)[0].steps == run.steps


def test_trl_units(tmp_path):
    info = trl_run_info(
        num_generations=8, per_device_train_batch_size=4, num_processes=4, gradient_accumulation_steps=2
    )
    assert (info.prompts, info.group_size, info.samples_per_step) == (4, 8, 32)
    info = trl_run_info(num_generations=8, per_device_train_batch_size=8, generation_batch_size=64)
    assert (info.prompts, info.samples_per_step) == (8, 8)  # one generation feeds 8 optimiser steps
    with pytest.raises(InputError, match="not a whole number of groups of 8"):
        trl_run_info(num_generations=8, per_device_train_batch_size=6)


def test_newest_checkpoint_and_bad_files(tmp_path):
    for n in (5, 10, 9):
        d = tmp_path / f"checkpoint-{n}"
        d.mkdir()
        (d / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": n, "loss": 1.0}]}))
    assert find_trainer_state(tmp_path) == tmp_path / "checkpoint-10" / "trainer_state.json"
    bad = tmp_path / "bad.json"
    bad.write_text('{"global_step": 3}')
    with pytest.raises(InputError, match="no log_history"):
        read_trl_state(bad, trl_run_info(4, 8))
    with pytest.raises(InputError, match="no trainer_state.json"):
        find_trainer_state(Path(tmp_path / "nowhere"))
