"""Trainer configs read back in batchtune's units, with the line of every value; names checked by a
round trip through the emitters (what `--emit` writes, `check` reads)."""

from __future__ import annotations

import json

import pytest

from batchtune.errors import InputError
from batchtune.integrations.emit import emit
from batchtune.integrations.emit_base import RecommendationInput
from batchtune.integrations.trainer_configs import read_trainer_config


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_verl_yaml_values_and_lines(tmp_path):
    p = write(
        tmp_path,
        "ppo.yaml",
        "data:\n  train_batch_size: 256\nactor_rollout_ref:\n  actor:\n    optim:\n      lr: 2.0e-6\n"
        "  rollout:\n    n: 8\n    max_num_seqs: 512\n",
    )
    tc = read_trainer_config(p)
    assert (tc.trainer, tc.prompts, tc.group_size, tc.batch_responses) == ("verl", 256, 8, 2048)
    assert tc.lr == pytest.approx(2e-6) and tc.generation_concurrency == 512
    assert (tc.line_of("batch"), tc.line_of("lr"), tc.line_of("group_size")) == (2, 6, 8)
    assert tc.name_of("batch") == "data.train_batch_size"


@pytest.mark.parametrize("trainer", ["verl", "trl", "openrlhf"])
def test_emitted_config_reads_back(tmp_path, trainer):
    rec = RecommendationInput(prompts=64, group_size=8, lr=1.5e-6, mini_batches=2, generation_concurrency=256)
    out = emit(trainer, rec, num_gpus=8)
    if trainer == "trl":  # GRPOConfig fields as YAML
        text = "".join(f"{k}: {v}\n" for k, v in out.values.items()) + "num_processes: 8\n"
        p = write(tmp_path, "grpo.yaml", text)
    else:  # the emitted command line itself, comments and continuations included
        p = write(tmp_path, "run.sh", out.text.replace("    ...", "    "))
    tc = read_trainer_config(p)
    assert tc.trainer == trainer
    assert (tc.prompts, tc.group_size) == (64, 8)
    assert tc.lr == pytest.approx(1.5e-6)
    assert tc.line_of("batch") is not None


def test_hydra_override_script_lines(tmp_path):
    p = write(
        tmp_path,
        "train.sh",
        "#!/bin/bash\nset -x\npython3 -m verl.trainer.main_ppo \\\n    data.train_batch_size=512 \\\n"
        "    actor_rollout_ref.rollout.n=16 \\\n    +actor_rollout_ref.actor.optim.lr=1e-6 \\\n"
        "    trainer.nnodes=2  # two nodes\n",
    )
    tc = read_trainer_config(p, "verl")
    assert (tc.prompts, tc.group_size, tc.lr) == (512, 16, 1e-6)
    assert (tc.line_of("batch"), tc.line_of("lr")) == (4, 6)


def test_trl_defaults_follow_grpoconfig(tmp_path):
    """generation_batch_size = per_device * processes * steps_per_generation (= grad accumulation)."""
    p = write(
        tmp_path,
        "args.txt",
        "accelerate launch --num_processes 4 train_grpo.py \\\n  --per_device_train_batch_size 8 \\\n"
        "  --gradient_accumulation_steps 2 --num_generations 8 --learning_rate 3e-6\n",
    )
    tc = read_trainer_config(p)
    assert tc.trainer == "trl"
    assert tc.batch_responses == 8 * 4 * 2 and tc.group_size == 8 and tc.prompts == 8
    assert tc.generation_concurrency == 16  # each process generates its share
    j = write(
        tmp_path, "grpo.json", json.dumps({"generation_batch_size": 256, "num_generations": 16}, indent=1)
    )
    tj = read_trainer_config(j)
    assert (tj.prompts, tj.group_size, tj.lr, tj.line_of("batch")) == (16, 16, None, 2)


def test_trl_yaml_takes_its_process_count_from_an_accelerate_launch_comment(tmp_path):
    """(Async)GRPOConfig(**yaml) refuses a num_processes key: a YAML file says the count in a comment,
    as batchtune's emitted ones do; a num_processes key still wins. AsyncGRPO generates on one vLLM
    server, max_inflight_tasks at once (its default -1: max_staleness x one optimiser step's)."""
    body = "per_device_train_batch_size: 8\nnum_generations: 8\nmax_staleness: 2\n"
    launch = "# run with 4 processes (accelerate launch --num_processes 4)\n"
    tc = read_trainer_config(write(tmp_path, "a.yaml", launch + body))
    assert (tc.batch_responses, tc.prompts, tc.line_of("batch")) == (32, 4, 2)
    assert (tc.engines, tc.generation_concurrency, tc.mode) == (1, 2 * 32, "async")
    assert not any("1 process assumed" in n for n in tc.notes)
    keyed = read_trainer_config(write(tmp_path, "b.yaml", launch + body + "num_processes: 2\n"))
    assert keyed.batch_responses == 16
    capped = read_trainer_config(write(tmp_path, "c.yaml", launch + body + "max_inflight_tasks: 24\n"))
    assert capped.generation_concurrency == 24
    bare = read_trainer_config(write(tmp_path, "d.yaml", "# accelerate launch\n" + body))
    assert bare.batch_responses == 8 and any("1 process assumed" in n for n in bare.notes)


def test_trl_async_default_inflight_floors_max_staleness_at_one(tmp_path):
    """trl 1.16 fills max_inflight_tasks only when it is below 0, as max(max_staleness, 1) x one
    step's completions: max_staleness 0 (a strict discard policy) read as concurrency 0 before."""
    launch = "# accelerate launch --num_processes 4\n"
    body = "per_device_train_batch_size: 8\nnum_generations: 8\nmax_staleness: 0\n"
    assert read_trainer_config(write(tmp_path, "a.yaml", launch + body)).generation_concurrency == 32
    unset = read_trainer_config(write(tmp_path, "b.yaml", launch + body + "max_inflight_tasks: -1\n"))
    assert unset.generation_concurrency == 32
    with pytest.raises(InputError, match="max_inflight_tasks = 0 must be a positive whole number"):
        read_trainer_config(write(tmp_path, "c.yaml", launch + body + "max_inflight_tasks: 0\n"))


def test_openrlhf_legacy_flags(tmp_path):
    p = write(
        tmp_path,
        "ppo.sh",
        "python3 -m openrlhf.cli.train_ppo_ray --rollout_batch_size 128 \\\n --n_samples_per_prompt 4 "
        "--actor_learning_rate=5e-7\n",
    )
    tc = read_trainer_config(p)
    assert (tc.trainer, tc.prompts, tc.group_size, tc.lr, tc.generation_concurrency) == (
        "openrlhf",
        128,
        4,
        5e-7,
        None,
    )
    assert tc.line_of("group_size") == 2


@pytest.mark.parametrize(
    ("name", "text", "fmt", "match"),
    [
        ("x.toml", "prompts = 8\n", "auto", "cannot tell"),
        ("x.toml", "prompts = 8\ngroup_size = 0\n", "generic", "positive whole number"),
        (
            "x.yaml",
            "data:\n  train_batch_size: ${oc.env:BS}\nactor_rollout_ref:\n  rollout:\n    n: 8\n",
            "verl",
            "not a number",
        ),
        ("x.json", '{"generation_batch_size": 20, "num_generations": 8}', "trl", "whole number of groups"),
        ("x.yaml", "a: [1,\n", "auto", "not valid YAML"),
        ("x.toml", "prompts = 8\ngroup_size = 8\n", "megatron", "--format"),
    ],
)
def test_bad_configs_say_what(tmp_path, name, text, fmt, match):
    with pytest.raises(InputError, match=match):
        read_trainer_config(write(tmp_path, name, text), fmt)


def test_generation_concurrency_is_per_engine(tmp_path):
    """verl's max_num_seqs caps each vLLM engine, and a step's responses are split over GPUs / TP
    engines; TRL's vLLM server generates the whole batch, colocated engines a TP group's share. The
    check read max_num_seqs (or each process's share) as the concurrency whatever the layout."""
    verl = "data:\n  train_batch_size: 16\nactor_rollout_ref:\n  rollout:\n    n: 8\n    max_num_seqs: 256\n"
    eight = write(
        tmp_path, "v8.yaml", verl + "    tensor_model_parallel_size: 1\ntrainer:\n  n_gpus_per_node: 8\n"
    )
    tc = read_trainer_config(eight)
    assert (tc.engines, tc.generation_concurrency) == (8, 16)  # 128 responses over 8 engines
    assert tc.settings["generation_concurrency"].value == 256  # the configured cap, as the file says
    one = write(
        tmp_path, "v1.yaml", verl + "    tensor_model_parallel_size: 1\ntrainer:\n  n_gpus_per_node: 1\n"
    )
    assert read_trainer_config(one).generation_concurrency == 128  # max_num_seqs 256: the whole step
    # verl's defaults: 8 GPUs per node, 1 node, rollout TP 2 (4 engines), max_num_seqs 256
    bare = read_trainer_config(write(tmp_path, "v.yaml", verl.replace("    max_num_seqs: 256\n", "")))
    assert (bare.engines, bare.generation_concurrency) == (4, 32)
    assert any("verl's default 256" in n for n in bare.notes)
    piped = (
        verl
        + "    tensor_model_parallel_size: 2\n    pipeline_model_parallel_size: 2\n"
        + "trainer:\n  n_gpus_per_node: 8\n"
    )
    assert read_trainer_config(write(tmp_path, "pp.yaml", piped)).engines == 2
    # a launch script's shell variable is not a number here, nor an error: the default, with a note
    script = write(
        tmp_path,
        "run.sh",
        "python3 -m verl.trainer.main_ppo \\\n    data.train_batch_size=16 \\\n"
        "    actor_rollout_ref.rollout.n=8 \\\n    trainer.nnodes=$NNODES \\\n"
        "    trainer.n_gpus_per_node=8\n",
    )
    env = read_trainer_config(script)
    assert env.engines == 4 and any("trainer.nnodes = '$NNODES' is not a number here" in n for n in env.notes)
    trl = "num_generations: 8\ngeneration_batch_size: 128\nnum_processes: 4\n"
    assert read_trainer_config(write(tmp_path, "t.yaml", trl)).generation_concurrency == 32  # 4 shares
    server = read_trainer_config(write(tmp_path, "s.yaml", trl + "use_vllm: true\nvllm_mode: server\n"))
    assert (server.engines, server.generation_concurrency) == (1, 128)
    colo = trl + "use_vllm: yes\nvllm_tensor_parallel_size: 2\n"  # colocate: trl's default since 1.0
    tp2 = read_trainer_config(write(tmp_path, "c.yaml", colo))
    assert (tp2.engines, tp2.generation_concurrency) == (2, 64)


def test_trl_async_read_in_a_probes_rollout_batches():
    """AsyncGRPO counts optimiser steps of b completions and versions of weight_sync_steps (w) steps:
    with weights synced every s rollout batches, u = w / s, B = u x b, ceil(k / s) = max_staleness."""
    from batchtune.integrations.trainer_configs_async import AsyncGrpoSteps, in_rollout_batches

    one = in_rollout_batches(AsyncGrpoSteps(16, 1, 2), 1)
    assert not isinstance(one, str)
    assert (one.batch_responses, one.updates_per_batch, one.staleness_lo, one.staleness_hi) == (32, 2, 1, 1)
    two = in_rollout_batches(AsyncGrpoSteps(16, 2, 4), 2)  # k 3 or 4 both keep ceil(k / 2) = 2
    assert not isinstance(two, str)
    assert (two.batch_responses, two.updates_per_batch, two.staleness_lo, two.staleness_hi) == (32, 2, 3, 4)
    fresh = in_rollout_batches(AsyncGrpoSteps(16, 0, 1), 1)
    assert not isinstance(fresh, str) and (fresh.staleness_lo, fresh.staleness_hi) == (0, 0)
    assert "not a multiple" in str(in_rollout_batches(AsyncGrpoSteps(16, 1, 3), 2))
    for bad in (float("inf"), float("nan"), 1.5, -1.0):
        assert "not whole numbers" in str(in_rollout_batches(AsyncGrpoSteps(16, bad, 1), 1))


def test_verl_fully_async_read_in_a_probes_rollout_batches():
    """A fully_async sync interval of n prompts and U updates, weights synced every s rollout batches:
    P = n / s, u = U / s, k = staleness_threshold x s + s - 1 (whole within the 3 places emitted)."""
    from batchtune.integrations.trainer_configs_async import FullyAsyncInterval, in_rollout_batches

    two = in_rollout_batches(FullyAsyncInterval(8, 8, 4, 0.0), 2)  # P4xG8-k1u2 synced every 2
    assert not isinstance(two, str)
    assert (two.batch_responses, two.updates_per_batch, two.staleness_lo, two.staleness_hi) == (32, 2, 1, 1)
    third = in_rollout_batches(FullyAsyncInterval(12, 8, 3, 0.333), 3)  # k = 3 written as 1/3
    assert not isinstance(third, str) and (third.batch_responses, third.staleness_hi) == (32, 3)
    alone = in_rollout_batches(FullyAsyncInterval(4, 8, 1, 0.1), 1)  # verl's default share: no whole k
    assert not isinstance(alone, str) and alone.staleness_lo == alone.staleness_hi == pytest.approx(0.1)
    assert "no whole number" in str(in_rollout_batches(FullyAsyncInterval(6, 8, 2, 0.0), 4))
    assert "no whole number" in str(in_rollout_batches(FullyAsyncInterval(8, 8, 3, 0.0), 2))
    for bad in (float("nan"), -0.5):
        assert "do not fit" in str(in_rollout_batches(FullyAsyncInterval(8, 8, 2, bad), 2))
