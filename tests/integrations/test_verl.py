"""verl's JSONL file logger.

The file below is written in the documented format of verl's FileLogger (verl/utils/tracking.py):
one line per step, {"step": N, "data": {...}} (an extra key, as here, is ignored), with the
metric names of verl/trainer/ppo/metric_utils.py and the actor/critic workers, and the validation
before training logged at step 0.
"""

from __future__ import annotations

import json

import pytest

from batchtune.errors import InputError
from batchtune.integrations.common import RunInfo
from batchtune.integrations.readers import read_log

P, G = 4, 2


def line(step, **data):
    return json.dumps({"step": step, "elapsed_seconds": 1.5 * step, "data": data}) + "\n"


def step_data(i, reward):
    return {
        "critic/score/mean": reward,
        "critic/rewards/mean": reward - 0.01,
        "actor/grad_norm": 1.0 / i,
        "critic/grad_norm": 0.5,
        "actor/lr": 1e-6,
        "critic/lr": 1e-5,
        "response_length/mean": 100.0 + i,
        "timing_s/gen": 2.0,
        "timing_s/update_actor": 1.0,
        "timing_s/update_critic": 0.5,
        "timing_s/step": 4.0,
        "training/global_step": i,
    }


@pytest.fixture
def verl_log(tmp_path):
    text = line(0, **{"val-core/openai/gsm8k/reward/mean@1": 0.10})
    text += line(1, **step_data(1, 0.2))
    text += line(2, **step_data(2, 0.3), **{"val-core/openai/gsm8k/reward/mean@1": 0.35})
    text += line(3, **step_data(3, 0.4))
    path = tmp_path / "exp.jsonl"
    path.write_text(text)
    return path


def test_verl_units_and_names(verl_log):
    (run,) = read_log(verl_log, "verl", RunInfo(prompts=P, group_size=G))
    steps = run.steps
    assert [s.step for s in steps] == [0, 1, 2, 3]
    assert [s.samples for s in steps] == [0, 8, 16, 24]  # step * train_batch_size * rollout.n
    assert [s.metrics.get("reward") for s in steps] == [None, 0.2, 0.3, 0.4]  # critic/score/mean
    assert [s.metrics.get("eval_reward") for s in steps] == [0.10, None, 0.35, None]
    assert steps[2].metrics["val-core/openai/gsm8k/reward/mean@1"] == 0.35  # raw keys kept too
    assert [s.grad_norm for s in steps] == [None, 1.0, 0.5, pytest.approx(1 / 3)]
    assert steps[1].critic_grad_norm == 0.5
    assert [s.lr for s in steps] == [1e-6] * 4  # step 0 logs no LR: the first logged one
    s1 = steps[1]
    assert (s1.gen_s, s1.train_s, s1.other_s) == (2.0, 1.5, 0.5)  # update_actor + update_critic
    assert [s.tokens for s in steps] == [0, 808, 1624, 2448]  # response_length/mean * responses
    assert (run.run_id, run.candidate, run.lr) == ("exp", "P4xG2", 1e-6)


def test_verl_needs_the_batch(verl_log):
    with pytest.raises(InputError, match="give prompts and group_size"):
        read_log(verl_log, "verl")


def test_verl_key_mapping(tmp_path):
    text = line(1, **step_data(1, 0.2), **{"val-core/a/reward/mean@1": 0.1, "val-core/b/reward/mean@1": 0.2})
    path = tmp_path / "two.jsonl"
    path.write_text(text)
    info = RunInfo(prompts=P, group_size=G)
    (run,) = read_log(path, "verl", info)
    assert "eval_reward" not in run.steps[0].metrics  # two data sources: the default does not guess
    (run,) = read_log(path, "verl", info, {"eval_reward": "val-core/b/reward/mean@1"})
    assert run.steps[0].metrics["eval_reward"] == 0.2
    with pytest.raises(InputError, match="matches 2 keys"):
        read_log(path, "verl", info, {"eval_reward": "val-core/*/reward/mean@1"})
    with pytest.raises(InputError, match="no log key 'val/acc' for eval_reward"):
        read_log(path, "verl", info, {"eval_reward": "val/acc"})


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"step": 1, "data": {}}\n{"step": 2, "da', r"exp\.jsonl:2: not valid JSON"),
        ('{"step": 1, "metrics": {}}\n', r"exp\.jsonl:1: expected .*verl file logger"),
        ('{"step": "x", "data": {}}\n', r"exp\.jsonl:1: 'step' must be a whole number"),
        ("\n", r"exp\.jsonl is empty"),
    ],
)
def test_verl_malformed(tmp_path, text, match):
    path = tmp_path / "exp.jsonl"
    path.write_text(text)
    with pytest.raises(InputError, match=match):
        read_log(path, "verl", RunInfo(prompts=P, group_size=G, lr=1e-6))
