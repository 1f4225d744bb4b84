"""Logs laid out as the trainers write them upstream (read in their sources: OpenRLHF v0.11.0
logging_utils.py, trl 1.16 grpo_trainer.py with transformers 5.24, verl b178a3cd tracking.py), in
the cases an audit found read wrong."""

from __future__ import annotations

import json

import pytest

from batchtune.errors import InputError
from batchtune.integrations.common import RunInfo
from batchtune.integrations.readers import read_log


def test_openrlhf_wandb_history_with_its_eval_rows(tmp_path):
    """log_eval is a wandb.log call of its own: eval/global_step set, train/global_step empty. The
    import stopped at the first such row ("'' is not a step number")."""
    head = "_step,_runtime,train/global_step,train/reward,eval/global_step,eval/eval_gsm8k_pass1"
    rows = [head, "0,57,1,0.35,,", "1,114,2,0.40,,", "2,120,,,2,0.31", "3,171,3,0.45,,"]
    path = tmp_path / "history.csv"
    path.write_text("\n".join(rows) + "\n")
    (run,) = read_log(path, "wandb", RunInfo(prompts=8, group_size=4, lr=1e-6))
    by = {s.step: s for s in run.steps}
    assert sorted(by) == [1, 2, 3]
    assert by[2].metrics["reward"] == pytest.approx(0.40) and by[2].metrics["eval_reward"] == pytest.approx(
        0.31
    )


def test_trl_tensorboard_and_wandb_keys_carry_train_prefix_in_trainer_state_they_do_not(tmp_path):
    """transformers' rewrite_logs puts every key under train/: step time and lengths were lost."""
    head = "train/global_step,train/reward,train/step_time,train/completions/mean_length,train/learning_rate"
    rows = [head, "1,0.1,2.5,10,1e-6", "2,0.2,2.5,12,1e-6"]
    path = tmp_path / "trl.csv"
    path.write_text("\n".join(rows) + "\n")
    (run,) = read_log(path, "wandb", RunInfo(prompts=2, group_size=4))
    assert [s.train_s for s in run.steps] == [2.5, 2.5]
    assert run.steps[-1].tokens == 8 * 10 + 8 * 12


@pytest.mark.parametrize(("logging_steps", "entries"), [(1, 4), (2, 2), (4, 1), (3, 2)])
def test_trl_tokens_count_every_generation_an_entry_averages(tmp_path, logging_steps, entries):
    """steps_per_generation 2: one generation of 16 completions feeds 2 logged optimiser steps, and
    an entry's completions/mean_length averages the generations since the entry before it (4 logged
    steps per 2 generations counted one of them)."""
    log = []
    for step in range(logging_steps, 5, logging_steps):
        entry = {"step": step, "reward": 0.1 * step, "learning_rate": 1e-6}
        first = step - logging_steps + 1
        if any((k - 1) % 2 == 0 for k in range(first, step + 1)):  # a generation in the window
            entry["completions/mean_length"] = 10.0
        log.append(entry)
    if logging_steps == 3:  # steps 3 (generations at 1, 3) and, cut short, 4 (none): add step 6
        log = [log[0], {"step": 6, "reward": 0.6, "learning_rate": 1e-6, "completions/mean_length": 10.0}]
    state = {"global_step": log[-1]["step"], "log_history": log}
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state))
    (run,) = read_log(path, "trl", RunInfo(prompts=4, group_size=4, samples_per_step=8))
    assert len(run.steps) == entries
    generations = (log[-1]["step"] + 1) // 2
    assert run.steps[-1].tokens == generations * 16 * 10


def test_verl_step_zero_validation_is_not_a_training_step(tmp_path):
    lines = [{"step": 0, "data": {"val-core/gsm8k/reward/mean@1": 0.2}}]
    lines += [{"step": k, "data": {"critic/score/mean": 0.1 * k, "actor/lr": 1e-6}} for k in range(1, 6)]
    path = tmp_path / "exp.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run,) = read_log(path, "verl", RunInfo(prompts=8, group_size=4))
    record, _ = run.to_records()
    assert record.steps == 5


def test_wandb_bookkeeping_rows_are_skipped_and_a_bad_step_names_its_column(tmp_path):
    head = "_step,_runtime,train/global_step,train/reward,eval/global_step,eval/reward"
    path = tmp_path / "h.csv"
    path.write_text("\n".join([head, "0,5,1,0.3,,", "1,9,,,,", "2,12,2,0.4,,"]) + "\n")
    (run,) = read_log(path, "wandb", RunInfo(prompts=8, group_size=4, lr=1e-6))
    assert [s.step for s in run.steps] == [1, 2]
    path.write_text("\n".join([head, "0,5,1,0.3,,", "1,9,,,x,0.2"]) + "\n")
    with pytest.raises(InputError, match="column 'eval/global_step': 'x' is not a step number"):
        read_log(path, "wandb", RunInfo(prompts=8, group_size=4, lr=1e-6))


def test_trl_tokens_skip_no_generation_behind_an_entry_without_a_length(tmp_path):
    """An eval entry between two logging steps moved the count on: a generation before it went
    uncounted."""
    log = [
        {"step": k, "reward": 0.1, "learning_rate": 1e-6, "completions/mean_length": 100.0}
        for k in (10, 20, 30)
    ]
    log.insert(1, {"step": 15, "eval_reward": 0.2})
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 30, "log_history": log}))
    (run,) = read_log(path, "trl", RunInfo(prompts=8, group_size=16, samples_per_step=32))
    # generations of 128 completions start every 4 steps of 32: 8 by step 30 (7 before the fix)
    assert run.steps[-1].tokens == 8 * 128 * 100


def test_a_run_whose_lr_is_zero_throughout_is_refused(tmp_path):
    path = tmp_path / "z.csv"
    path.write_text("step,prompts,group_size,lr,score\n1,8,8,0,0.1\n2,8,8,0,0.2\n")
    with pytest.raises(InputError, match="logs an lr of 0 at every step; give the run's --lr"):
        read_log(path, "csv", RunInfo())


def test_trl_eval_and_loss_under_their_tensorboard_and_wandb_names(tmp_path):
    head = "train/global_step,train/reward,train/loss,eval/reward,train/learning_rate"
    path = tmp_path / "t.csv"
    path.write_text("\n".join([head, "1,0.1,2.0,,1e-6", "2,0.2,1.9,0.15,1e-6"]) + "\n")
    (run,) = read_log(path, "wandb", RunInfo(prompts=2, group_size=4))
    assert run.steps[1].metrics["eval_reward"] == pytest.approx(0.15) and run.steps[1].metrics["loss"] == 1.9
