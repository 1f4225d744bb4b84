"""TRL (huggingface/trl): reading ``trainer_state.json``, writing ``GRPOConfig`` arguments.

``trainer_state.json`` (transformers' TrainerState) holds ``log_history``: one dict per logging step
with ``step``, ``learning_rate``, ``grad_norm`` (pre-clip, as clip_grad_norm_ returns it), GRPO's
``reward``, ``reward_std``, ``completions/mean_length``, ``num_tokens``, ``step_time``, ... and,
after an evaluation, ``eval_reward`` etc. at the same step. Names checked against trl 1.16
``GRPOTrainer`` (``_metrics`` keys) and ``GRPOConfig``.

Units: ``per_device_train_batch_size`` and ``generation_batch_size`` count completions;
``num_generations`` is G. One optimiser step consumes ``per_device_train_batch_size * num_processes *
gradient_accumulation_steps`` completions (fresh ones: that over ``num_iterations``), so samples =
step * that; the batch P*G is the generation batch. The state file does not record these numbers:
give them (:func:`trl_run_info`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from batchtune.errors import InputError
from batchtune.integrations.common import ImportedRun, LogKeys, RunInfo, StepEntry, as_number, merge_by_step
from batchtune.integrations.convert import build_run
from batchtune.integrations.emit_async import async_split, trl_async
from batchtune.integrations.emit_base import (
    UNKNOWN_LR_NOTE,
    EmittedConfig,
    RecommendationInput,
    check_recommendation,
    commented,
    micro_note,
    unfit_hint,
)
from batchtune.integrations.logs_generic import read_log_text

TRL_KEYS = LogKeys(
    # (TensorBoard and W&B: transformers' rewrite_logs writes eval_x as eval/x and x as train/x)
    metrics={
        "reward": ("reward", "train/reward"),
        "eval_reward": ("eval_reward", "eval/reward"),
        "loss": ("loss", "train/loss"),
        # AsyncGRPOTrainer (trl.experimental.async_grpo): versions a consumed completion lags, and
        # the seconds of each weight sync, as the built-in async run names them
        "staleness": ("sample/staleness_mean", "train/sample/staleness_mean"),
        "sync_s": ("perf/weight_sync_s", "train/perf/weight_sync_s"),
    },
    grad_norm=("grad_norm",),
    lr=("learning_rate", "train/learning_rate"),  # trainer_state.json; W&B and TensorBoard add train/
    # TRL times generation and update together: the whole step, imported as train_s so the
    # throughput of the cluster that logged it ranks the runs (recommend --throughput probe)
    # (TensorBoard and W&B get every key under train/: transformers' rewrite_logs)
    train_s=("step_time", "train/step_time"),
    response_length=("completions/mean_length", "train/completions/mean_length"),
)


def trl_run_info(
    num_generations: int,
    per_device_train_batch_size: int,
    num_processes: int = 1,
    gradient_accumulation_steps: int = 1,
    generation_batch_size: int = 0,
    num_iterations: int = 1,
    lr: float = 0.0,
    seed: int = 0,
    run_id: str = "",
) -> RunInfo:
    """RunInfo from GRPOConfig numbers. Completions per optimiser step = per_device_train_batch_size *
    num_processes * gradient_accumulation_steps, of which 1/num_iterations are fresh (each generation
    is reused num_iterations times). The batch P*G is the generation batch (generation_batch_size,
    by default one optimiser step's completions)."""
    numbers = (
        num_generations,
        per_device_train_batch_size,
        num_processes,
        gradient_accumulation_steps,
        num_iterations,
    )
    if min(numbers) < 1 or generation_batch_size < 0:
        raise InputError("TRL batch numbers must be positive")
    per_step = per_device_train_batch_size * num_processes * gradient_accumulation_steps
    generation = generation_batch_size or per_step
    if generation % num_generations:
        raise InputError(
            f"generation batch of {generation} completions is not a whole number of groups of "
            f"{num_generations}; give prompts and group_size directly"
        )
    if per_step % num_iterations:
        raise InputError(f"{per_step} completions per step do not split into {num_iterations} iterations")
    return RunInfo(
        prompts=generation // num_generations,
        group_size=num_generations,
        lr=lr,
        seed=seed,
        run_id=run_id,
        samples_per_step=per_step // num_iterations,
    )


def find_trainer_state(path: str | Path) -> Path:
    """``path`` itself, its trainer_state.json, or that of its newest checkpoint-N folder."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        if (path / "trainer_state.json").is_file():
            return path / "trainer_state.json"
        ckpts = [
            p
            for p in path.glob("checkpoint-*/trainer_state.json")
            if re.fullmatch(r"checkpoint-\d+", p.parent.name)
        ]
        if ckpts:
            return max(ckpts, key=lambda p: int(p.parent.name.split("-")[1]))
    raise InputError(f"{path}: no trainer_state.json (nor checkpoint-N/trainer_state.json)")


def read_trl_state(path: str | Path, info: RunInfo, keys: LogKeys | None = None) -> ImportedRun:
    """Read one run from a transformers/TRL ``trainer_state.json`` (or a folder holding one)."""
    state_path = find_trainer_state(path)
    try:
        state = json.loads(read_log_text(state_path))
    except json.JSONDecodeError as exc:
        raise InputError(f"{state_path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{state_path}: nested too deep to be a trainer_state.json") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise InputError(f"{state_path}: no log_history list; is this a transformers trainer_state.json?")
    entries = []
    for i, item in enumerate(history):
        where = f"{state_path}: log_history[{i}]"
        if not isinstance(item, dict):
            raise InputError(f"{where}: expected an object")
        if "train_runtime" in item:  # the end-of-training summary, not a step
            continue
        step = item.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InputError(f"{where}: 'step' must be a whole number, got {step!r}")
        values = {k: x for k, raw in item.items() if k != "step" and (x := as_number(raw)) is not None}
        entries.append(StepEntry(step=step, values=values, where=where))
    if not entries:
        raise InputError(
            f"{state_path}: log_history has no logged steps (was logging_steps larger than the run?)"
        )
    # TRL saves into <output_dir>/checkpoint-N: the output dir names the run, not the checkpoint
    folder = state_path.parent
    if re.fullmatch(r"checkpoint-\d+", folder.name) and folder.parent.name:
        folder = folder.parent
    default_id = folder.name or state_path.stem
    return build_run(merge_by_step(entries), info, keys or TRL_KEYS, str(state_path), default_id)


# ---- emitting -------------------------------------------------------------------------------------


def _trl_problem(P: int, G: int, mini_batches: int, num_gpus: int, micro: int) -> str:
    """Why GRPOConfig cannot express this batch, or "". Checked against trl 1.16 GRPOConfig.__post_init__:
    generation_batch_size divisible by per_device_train_batch_size * num_processes and by num_generations;
    num_generations >= 2."""
    N = P * G
    if G < 2:
        return "GRPO needs num_generations >= 2"
    if N % mini_batches:
        return f"{N} completions do not split into {mini_batches} equal optimiser steps"
    per_step = N // mini_batches
    if per_step % num_gpus:
        return f"{per_step} completions per optimiser step are not divisible by {num_gpus} processes"
    per_gpu = per_step // num_gpus
    if micro and per_gpu % micro:
        return (
            f"{per_gpu} completions per GPU per step are not divisible by per_device_train_batch_size={micro}"
        )
    return ""


def emit_trl(rec: RecommendationInput, num_gpus: int) -> EmittedConfig:
    """``GRPOConfig`` arguments (all batch sizes in completions). One generation of P*G completions
    feeds ``mini_batches`` optimiser steps."""
    check_recommendation(rec, num_gpus)
    if rec.algorithm != "grpo":
        raise InputError("TRL's emitter covers GRPOTrainer only; for PPO emit verl or openrlhf")
    rollout_gpus, num_gpus, split_notes = async_split(rec, num_gpus)  # async: train on the rest
    P, G = rec.prompts, rec.group_size
    problem = _trl_problem(P, G, rec.mini_batches, num_gpus, rec.micro_batch_per_gpu)
    if problem:
        per_gpu = P * G // rec.mini_batches // num_gpus
        hint = unfit_hint(
            _trl_problem, rec, num_gpus, rec.mini_batches, "per_device_train_batch_size", per_gpu, "prompts"
        )
        raise InputError(f"TRL cannot run P={P} x G={G} on {num_gpus} GPUs: {problem}{hint}")
    N = P * G
    per_gpu = N // rec.mini_batches // num_gpus
    micro = rec.micro_batch_per_gpu or per_gpu
    values: dict[str, object] = {
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": per_gpu // micro,
        "num_generations": G,
        "generation_batch_size": N,
        "num_iterations": rec.epochs,
    }
    stale = rec.staleness > 0
    if stale:  # AsyncGRPOConfig: no generation_batch_size nor num_iterations; it streams completions
        del values["generation_batch_size"], values["num_iterations"]
    if rec.lr_known:
        values["learning_rate"] = rec.lr
    # GRPOConfig's default is TrainingArguments' linear decay to 0 over max_steps: the probe measured
    # a constant LR
    values["lr_scheduler_type"] = "constant"
    if rec.gpu_memory_utilization and not stale:  # AsyncGRPO's vLLM is a server started on its own
        values["vllm_gpu_memory_utilization"] = rec.gpu_memory_utilization
    async_values: dict[str, object] = {}
    async_notes: list[str] = []
    if stale:
        async_values, async_notes = trl_async(rec, rollout_gpus, num_gpus + rollout_gpus)
    elif rollout_gpus:  # on-policy on separate GPUs: GRPOTrainer against a vLLM server
        async_values = {"use_vllm": True, "vllm_mode": "server"}
        async_notes = [f"serve the policy with `trl vllm-serve` on the other {rollout_gpus} GPU(s)"]
    values.update(async_values)
    notes = [
        f"{P} prompts x {G} = {N} completions generated per {rec.updates_per_batch} optimiser step(s); "
        f"run with {num_gpus} processes (accelerate launch --num_processes {num_gpus})",
    ]
    if not stale:
        notes.append(
            "generation_batch_size and steps_per_generation are mutually exclusive; TRL derives "
            f"steps_per_generation = {N // (micro * num_gpus)}"
        )
    if rec.epochs > 1:
        notes.append(
            f"num_iterations={rec.epochs}: each generation is reused for {rec.epochs} passes (TRL's mu)"
        )
    notes += split_notes + async_notes
    notes += micro_note("per_device_train_batch_size", per_gpu, rec.micro_batch_per_gpu)
    if not rec.lr_known:
        notes.append(UNKNOWN_LR_NOTE)
    if rec.generation_concurrency and not stale:
        notes.append(
            "TRL generates each process's share of the generation batch at once; "
            f"generation_concurrency={rec.generation_concurrency} has no separate GRPOConfig setting"
        )
    body = "".join(f"    {k}={v!r},\n" for k, v in values.items())
    flags = " ".join(f"--{k} {v}" for k, v in values.items())
    if stale:
        text = (
            "from trl.experimental.async_grpo import AsyncGRPOConfig\n"
            f"AsyncGRPOConfig(\n{body}    ...  # output_dir, model and vllm_server_base_url\n)\n"
        )
    else:
        text = (
            f"GRPOConfig(\n{body}    ...  # output_dir, model and generation settings\n)\n"
            f"# CLI: trl grpo {flags}\n"
        )
    return EmittedConfig("trl", commented(text, notes), values, tuple(notes))
