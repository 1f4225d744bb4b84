"""Emitters: the winner in each trainer's own units, value by value, and its divisibility rules."""

from __future__ import annotations

import pytest

from batchtune.errors import InputError
from batchtune.integrations.emit import emit
from batchtune.integrations.emit_base import RecommendationInput


def rec(**kw):
    base = {"prompts": 128, "group_size": 8, "lr": 1.4e-6}
    return RecommendationInput(**{**base, **kw})


def test_verl_grpo_values():
    out = emit(
        "verl",
        rec(mini_batches=2, micro_batch_per_gpu=4, generation_concurrency=256, gpu_memory_utilization=0.6),
        num_gpus=8,
    )
    assert out.values == {
        "algorithm.adv_estimator": "grpo",
        "data.train_batch_size": 128,  # prompts
        "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 64,  # prompts: 2 updates per step
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,  # responses
        "actor_rollout_ref.actor.optim.lr": 1.4e-6,
        "actor_rollout_ref.rollout.max_num_seqs": 256,
        "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
        "trainer.n_gpus_per_node": 8,
        "trainer.nnodes": 1,
    }
    assert (
        "data.train_batch_size=128 \\" in out.text and "actor_rollout_ref.actor.optim.lr=1.4e-06" in out.text
    )
    assert out.text.startswith("python3 -m verl.trainer.main_ppo")


def test_verl_ppo_critic_has_its_own_lr_and_mini_batch():
    out = emit(
        "verl", rec(algorithm="ppo", critic_lr=9e-6, critic_mini_batches=4), num_gpus=16, gpus_per_node=8
    )
    v = out.values
    assert v["algorithm.adv_estimator"] == "gae"
    assert v["actor_rollout_ref.actor.ppo_mini_batch_size"] == 128
    assert v["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 64  # 128*8/16: no accumulation
    assert (v["critic.ppo_mini_batch_size"], v["critic.optim.lr"]) == (32, 9e-6)
    assert v["critic.ppo_micro_batch_size_per_gpu"] == 16
    assert (v["trainer.n_gpus_per_node"], v["trainer.nnodes"]) == (8, 2)


@pytest.mark.parametrize(
    ("kw", "gpus", "match"),
    [
        (
            {"prompts": 3, "group_size": 5},
            8,
            r"15 responses is not divisible by 8 GPUs; nearest valid "
            r"data.train_batch_size: 8",
        ),
        ({"prompts": 12, "mini_batches": 8}, 8, r"12 prompts do not split into 8 equal mini-batches"),
        (
            {"prompts": 8, "group_size": 2, "mini_batches": 4},
            8,
            r"ppo_mini_batch_size\*rollout.n = 4 .* 8 GPUs",
        ),
        ({"micro_batch_per_gpu": 3}, 8, r"use ppo_micro_batch_size_per_gpu=2 \(it must divide 128\)"),
    ],
)
def test_verl_divisibility(kw, gpus, match):
    with pytest.raises(InputError, match=match):
        emit("verl", rec(**kw), num_gpus=gpus)


def test_trl_values_and_grpoconfig_accepts_them(tmp_path):
    trl = pytest.importorskip("trl")
    out = emit("trl", rec(prompts=16, lr=1e-6, micro_batch_per_gpu=8), num_gpus=4)
    assert out.values == {
        "per_device_train_batch_size": 8,  # completions
        "gradient_accumulation_steps": 4,  # 128 completions / (8 x 4 processes)
        "num_generations": 8,
        "generation_batch_size": 128,
        "learning_rate": 1e-6,
        "lr_scheduler_type": "constant",  # GRPOConfig's default decays the LR to 0 over max_steps
        "num_iterations": 1,
    }
    one = emit("trl", rec(prompts=4, group_size=4, mini_batches=2, micro_batch_per_gpu=4), num_gpus=1)
    assert one.values["gradient_accumulation_steps"] == 2 and one.values["generation_batch_size"] == 16
    cfg = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **one.values)
    assert cfg.steps_per_generation == 4  # one generation of 16 feeds 2 optimiser steps of 2 x 4
    assert cfg.lr_scheduler_type == "constant"  # the probe's LR, held
    assert "GRPOConfig(" in one.text and "--num_generations 4" in one.text


def test_trl_rules():
    with pytest.raises(
        InputError,
        match=r"15 completions per optimiser step are not divisible by 4 processes; "
        r"nearest valid prompts: 4",
    ):
        emit("trl", rec(prompts=3, group_size=5), num_gpus=4)
    with pytest.raises(InputError, match="GRPOTrainer only"):
        emit("trl", rec(algorithm="ppo"), num_gpus=1)
    with pytest.raises(InputError, match="num_generations >= 2"):
        emit("trl", rec(group_size=1), num_gpus=1)


def test_openrlhf_values_both_flag_styles():
    r = rec(
        algorithm="ppo",
        lr=5e-7,
        critic_lr=9e-6,
        mini_batches=8,
        micro_batch_per_gpu=8,
        gpu_memory_utilization=0.5,
    )
    out = emit("openrlhf", r, num_gpus=8)
    assert out.values == {
        "--algo.advantage.estimator": "gae",
        "--rollout.batch_size": 128,  # prompts
        "--rollout.n_samples_per_prompt": 8,
        "--train.batch_size": 128,  # responses: 1024 / 8 updates
        "--train.micro_batch_size": 8,
        "--actor.adam.lr": 5e-7,
        "--actor.num_nodes": 1,
        "--actor.num_gpus_per_node": 8,
        "--critic.adam.lr": 9e-6,
        "--vllm.gpu_memory_utilization": 0.5,
    }
    legacy = emit("openrlhf", r, num_gpus=8, legacy_flags=True).values
    assert legacy["--rollout_batch_size"] == 128 and legacy["--micro_train_batch_size"] == 8
    assert legacy["--actor_learning_rate"] == 5e-7 and legacy["--critic_learning_rate"] == 9e-6
    assert legacy["--advantage_estimator"] == "gae"
    # the constant-LR note names the scheduler flag of the same OpenRLHF generation
    assert any("--actor.lr_scheduler constant" in n for n in out.notes)
    old = emit("openrlhf", r, num_gpus=8, legacy_flags=True).notes
    assert any("--lr_scheduler constant" in n for n in old) and not any(
        "--actor.lr_scheduler" in n for n in old
    )


def test_openrlhf_rules():
    with pytest.raises(InputError, match="one --train.batch_size for actor and critic"):
        emit("openrlhf", rec(algorithm="ppo", critic_mini_batches=2), num_gpus=8)
    with pytest.raises(InputError, match=r"use train.micro_batch_size=2"):
        emit("openrlhf", rec(micro_batch_per_gpu=3), num_gpus=8)
    with pytest.raises(InputError, match="fewer than 16 actor GPUs"):
        emit("openrlhf", rec(prompts=1, group_size=8), num_gpus=16)


def test_bad_input():
    with pytest.raises(InputError, match="unknown trainer 'megatron'"):
        emit("megatron", rec(), num_gpus=8)
    with pytest.raises(InputError, match="learning rates cannot be negative"):
        emit("verl", rec(lr=-1.0), num_gpus=8)


@pytest.mark.parametrize("trainer", ["verl", "trl", "openrlhf"])
def test_unknown_lr_is_left_out_with_a_note(trainer):
    out = emit(trainer, rec(lr=float("nan")), num_gpus=8)  # a winner from measurements without LRs
    assert not any(("lr" in k.lower() and "scheduler" not in k) or "learning_rate" in k for k in out.values)
    assert any("no learning rate" in n for n in out.notes) and "# the recommendation carries" in out.text


def test_recommend_emits_for_the_winner():
    """`batchtune recommend --emit` path: the published Hunyuan example's winner, 1024 prompts x 8."""
    from pathlib import Path

    from batchtune.recipe.load import shipped_recipes
    from batchtune.workflow.recommend import recommend_from_args

    measurements = Path(shipped_recipes()["hunyuan-grpo-measurements"])
    rec, text, values = recommend_from_args(measurements=measurements, emit="verl", gpus=8)
    assert (values["data.train_batch_size"], values["actor_rollout_ref.rollout.n"]) == (1024, 8)
    assert "data.train_batch_size=1024" in text and "no learning rate" in text  # the study gives no LRs


def test_multi_node_layout():
    r = rec(prompts=32, group_size=8, lr=1e-6)
    verl = emit("verl", r, num_gpus=16, gpus_per_node=8)
    assert verl.values["trainer.n_gpus_per_node"] == 8 and verl.values["trainer.nnodes"] == 2
    orl = emit("openrlhf", r, num_gpus=16, gpus_per_node=8)
    assert orl.values["--actor.num_nodes"] == 2 and orl.values["--actor.num_gpus_per_node"] == 8
    legacy = emit("openrlhf", r, num_gpus=16, gpus_per_node=8, legacy_flags=True)
    assert legacy.values["--actor_num_nodes"] == 2
    with pytest.raises(InputError, match="do not fill nodes"):
        emit("verl", r, num_gpus=12, gpus_per_node=8)
