"""The pre-training schedule in Megatron-LM, nanoGPT, HF and torchtitan units (emit_pretrain.py)."""

from __future__ import annotations

import pytest

from batchtune.analysis.pretrain.schedule import ScheduleStage
from batchtune.errors import InputError
from batchtune.integrations.emit_pretrain import emit_pretrain, stage_units

# Zhou et al.'s Qwen3 shape at seq 4096: 2M -> 4M tokens per batch at 125B tokens
STAGES = (ScheduleStage(0.0, 2 * 4096 * 256, 3e-4), ScheduleStage(125e9, 4 * 4096 * 256, 4.243e-4, 0.1))


def test_units_round_to_micro_batch_times_gpus():
    units = stage_units(STAGES, 4096, 250_000_000_000, unit_seqs=8)
    assert [u.batch_seqs for u in units] == [512, 1024]
    assert units[0].steps == 125_000_000_000 // (512 * 4096) + 1
    odd = stage_units((ScheduleStage(0.0, 100 * 4096, 1e-3),), 4096, 10**9, unit_seqs=8)
    assert odd[0].batch_seqs == 96
    same = (ScheduleStage(0.0, 42.0, 2e-3), ScheduleStage(15_000.0, 52.0, 2.2e-3))  # both 3 x 16
    merged = stage_units(same, 16, 60_000, unit_seqs=1)
    assert [(u.batch_seqs, u.end_tokens, u.lr) for u in merged] == [(3, 60_000, 2e-3)]


def test_megatron_flags():
    text = emit_pretrain("megatron", STAGES, seq_len=4096, total_tokens=250 * 10**9, gpus=8)
    assert "--seq-length 4096 --micro-batch-size 1 --train-samples 61035157 \\" in text
    assert '--step-batch-size-schedule "0:512 125000000000:1024" \\' in text
    assert "--lr 0.0003 --lr-decay-style constant" in text
    flags = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert "--global-batch-size" not in flags  # Megatron refuses it with a step schedule
    assert "--train-samples 61035157 --lr 0.0004243 --override-opt_param-scheduler" in text
    assert "--rampup-batch-size 512 8 30517579 --global-batch-size 1024" in text


def test_nanogpt_and_hf():
    kw = {"seq_len": 4096, "total_tokens": 250 * 10**9, "gpus": 8, "micro_batch_seqs": 4}
    nano = emit_pretrain("nanogpt", STAGES, **kw)
    assert "init_from = 'scratch'" in nano and "init_from = 'resume'" in nano
    assert "gradient_accumulation_steps = 128  # total over 8 GPU(s)" in nano
    assert "max_iters = 59605  #" in nano and "max_iters = 89408  #" in nano
    assert "weight_decay = 0.1" in nano
    # nanoGPT saves only where iter_num % eval_interval == 0: each stage's end must be one
    assert "eval_interval = 59605  #" in nano and "eval_interval = 89408  #" in nano
    assert nano.count("always_save_checkpoint = True") == 2
    hf = emit_pretrain("hf", STAGES, **kw)
    assert "per_device_train_batch_size=4, gradient_accumulation_steps=16, max_steps=59605," in hf
    assert "gradient_accumulation_steps=32, max_steps=89408" in hf and "ignore_data_skip=True" in hf
    assert "scheduler.pt" in hf and "Adam's moments start afresh" in hf
    # stage 2 starts where stage 1's whole steps left the data: 59,605 steps x 512 sequences
    assert f"dataset started {59605 * 512:,} sequences in" in hf


def test_bad_requests():
    with pytest.raises(InputError, match="choose megatron"):
        emit_pretrain("levanter", STAGES, seq_len=4096, total_tokens=10**12)
    with pytest.raises(InputError, match="beyond the last stage"):
        emit_pretrain("hf", STAGES, seq_len=4096, total_tokens=10**9)
    with pytest.raises(InputError, match="no schedule"):
        emit_pretrain("hf", (), seq_len=4096, total_tokens=10**9)


def test_torchtitan_toml_per_stage():
    import tomllib

    kw = {"seq_len": 4096, "total_tokens": 250 * 10**9, "gpus": 8, "micro_batch_seqs": 4}
    text = emit_pretrain("torchtitan", STAGES, **kw)
    files = text.split("# ---- ")[1:]
    assert [f.split(" ", 1)[0] for f in files] == ["stage1.toml", "stage2.toml"]
    one, two = (tomllib.loads(f.split("\n", 1)[1]) for f in files)
    assert one["training"] == {
        "seq_len": 4096,
        "local_batch_size": 4,
        "global_batch_size": 512,
        "steps": 59605,
    }
    # torchtitan's default saves the model alone at the last step, which stage 2 could not load
    assert one["optimizer"] == {"lr": 3e-4}
    assert one["checkpoint"] == {"enable": True, "last_save_model_only": False}
    assert one["lr_scheduler"] == {"warmup_steps": 0, "decay_ratio": 0.0}
    assert two["training"]["global_batch_size"] == 1024 and two["training"]["steps"] == 59605 + 29803
    assert two["optimizer"] == {"lr": 4.243e-4, "weight_decay": 0.1}
    assert two["checkpoint"] == {
        "enable": True,
        "last_save_model_only": False,
        "load_step": 59605,
        "exclude_from_loading": ["lr_scheduler"],
    }
    assert "--training.num_tokens_per_train_step 4194304" in files[1]
