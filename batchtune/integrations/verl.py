"""verl (volcengine/verl): reading its JSONL file logger, writing its Hydra overrides.

The file logger (``trainer.logger=['console','file']``; ``verl/utils/tracking.py`` ``FileLogger``)
appends one line per step, ``{"step": N, "data": {"critic/score/mean": ..., ...}}``, to
``$VERL_FILE_LOGGER_PATH``, or to
``$VERL_FILE_LOGGER_ROOT/<project_name>/<experiment_name>.jsonl`` when that is unset. Step N is one
rollout batch of ``data.train_batch_size`` prompts x ``rollout.n`` responses, so samples consumed =
N * P * G. Validation before training is logged at step 0. Metric names follow
``verl/trainer/ppo/metric_utils.py`` (``critic/score/mean``, ``response_length/mean``,
``timing_s/gen``, ...) and the workers (``actor/grad_norm``, ``actor/lr``, ``critic/grad_norm``).
"""

from __future__ import annotations

import json
from pathlib import Path

from batchtune.errors import InputError
from batchtune.integrations.common import ImportedRun, LogKeys, RunInfo, StepEntry, as_number, merge_by_step
from batchtune.integrations.convert import build_run
from batchtune.integrations.emit_async import VERL_MODULES, VERL_V1, async_split, node_layout, verl_async
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

# the async side, under the names the built-in async run records (backends/torch_rl/async_run.py),
# so an imported run feeds the joint decision: V1 (trainer/ppo/v1/trainer_base.py: versions a
# trajectory lags, the freshest weights it used; update_weights timer) and fully_async
# (fully_async_trainer.py param_sync timer; detach_utils.py and fully_async_rollouter.py idle ratios)
ASYNC_METRICS = {
    "staleness": ("training/off_policy/trajectory_staleness/mean",),
    "sync_s": ("timing_s/update_weights", "timing_s/param_sync"),
    "trainer_idle_ratio": ("fully_async/trainer/idle_ratio",),
    "rollout_idle_ratio": ("fully_async/rollouter/idle_ratio",),
    "queue_wait_s": ("timing_s/wait_for_enough_samples",),
}

VERL_KEYS = LogKeys(
    metrics={
        "reward": ("critic/score/mean",),  # sequence score before KL penalty (rewards/mean is after)
        "eval_reward": ("val-core/*/reward/mean@*", "val-core/*/acc/mean@*"),
        **ASYNC_METRICS,
    },
    grad_norm=("actor/grad_norm",),
    critic_grad_norm=("critic/grad_norm",),
    lr=("actor/lr",),
    gen_s=("timing_s/gen",),
    train_s=("timing_s/update_actor", "timing_s/update_critic"),
    step_s=("timing_s/step",),
    response_length=("response_length/mean",),
)


def read_verl(
    path: str | Path, info: RunInfo, keys: LogKeys | None = None, partial: bool = False
) -> ImportedRun:
    """Read one run from verl's JSONL file logger. ``info`` must give prompts (data.train_batch_size)
    and group_size (actor_rollout_ref.rollout.n); the LR comes from ``actor/lr`` when logged."""
    path = Path(path)
    lines = read_log_text(path).split("\n")
    if partial and lines and lines[-1].strip():
        lines = lines[:-1]
    entries = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{where}: not valid JSON ({exc.msg}); is this verl's file logger output?"
            ) from None
        except RecursionError:
            raise InputError(f"{where}: nested too deep to be a log line") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("data"), dict):
            raise InputError(f'{where}: expected {{"step": N, "data": {{...}}}} (verl file logger format)')
        step = obj.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InputError(f"{where}: 'step' must be a whole number >= 0, got {step!r}")
        values = {k: x for k, raw in obj["data"].items() if (x := as_number(raw)) is not None}
        entries.append(StepEntry(step=step, values=values, where=where))
    if not entries:
        raise InputError(f"{path} is empty: expected verl file-logger lines {{'step': N, 'data': {{...}}}}")
    return build_run(merge_by_step(entries), info, keys or VERL_KEYS, str(path), path.stem)


# ---- emitting -------------------------------------------------------------------------------------


def _verl_problem(P: int, G: int, mini_batches: int, dp: int, micro: int) -> str:
    """Why verl would reject this batch on ``dp`` data-parallel GPUs (FSDP, no sequence parallel), or "".

    Rules checked (verl ray_trainer._validate_config and fsdp_workers): train_batch_size * n divisible by
    the GPU count; ppo_mini_batch_size * n divided by the GPU count exactly (verl floors it otherwise)
    and at least 1; the per-GPU mini-batch divisible by ppo_micro_batch_size_per_gpu.
    """
    if P % mini_batches:
        return f"{P} prompts do not split into {mini_batches} equal mini-batches"
    if (P * G) % dp:
        return f"data.train_batch_size*rollout.n = {P * G} responses is not divisible by {dp} GPUs"
    mini = P // mini_batches
    if (mini * G) % dp:
        return f"ppo_mini_batch_size*rollout.n = {mini * G} responses is not divisible by {dp} GPUs"
    if micro and (mini * G // dp) % micro:
        return (
            f"the per-GPU mini-batch ({mini * G // dp} responses) is not divisible by "
            f"ppo_micro_batch_size_per_gpu={micro}"
        )
    return ""


def emit_verl(
    rec: RecommendationInput, num_gpus: int, gpus_per_node: int = 0, async_trainer: str = VERL_V1
) -> EmittedConfig:
    """Hydra overrides for ``python3 -m verl.trainer.main_ppo``. Batch sizes in prompts except the
    micro-batch (responses per GPU), as verl counts them. An off-policy or async pick (emit_async.py)
    adds ``async_trainer``'s keys: V1 (main_ppo), fully_async or one_step_off (verl.experimental)."""
    check_recommendation(rec, num_gpus)
    rollout_gpus, train_gpus, split_notes = async_split(rec, num_gpus)
    P, G, dp = rec.prompts, rec.group_size, train_gpus
    per_node = min(gpus_per_node or num_gpus, num_gpus)
    if num_gpus % per_node and not rollout_gpus:
        raise InputError(f"{num_gpus} GPUs do not fill nodes of {per_node}; give a multiple of {per_node}")
    nodes, node_gpus = (
        node_layout(train_gpus, per_node, "trainer") if rollout_gpus else (num_gpus // per_node, per_node)
    )
    critic_mb = rec.critic_mini_batches or rec.mini_batches
    for role, mb in (("actor", rec.mini_batches), ("critic", critic_mb if rec.algorithm == "ppo" else None)):
        if mb is None:
            continue
        problem = _verl_problem(P, G, mb, dp, rec.micro_batch_per_gpu)
        if problem:
            hint = unfit_hint(
                _verl_problem, rec, dp, mb, "ppo_micro_batch_size_per_gpu", P // mb * G // dp,
                "data.train_batch_size",
            )  # fmt: skip
            where = f"{dp} trainer GPUs" if rollout_gpus else f"{dp} GPUs"
            raise InputError(f"verl cannot run P={P} x G={G} on {where} ({role}): {problem}{hint}")
    mini = P // rec.mini_batches
    per_gpu = mini * G // dp
    micro = rec.micro_batch_per_gpu or per_gpu
    values: dict[str, object] = {
        "algorithm.adv_estimator": "gae" if rec.algorithm == "ppo" else "grpo",
        "data.train_batch_size": P,
        "actor_rollout_ref.rollout.n": G,
        "actor_rollout_ref.actor.ppo_mini_batch_size": mini,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
    }
    if rec.lr_known:
        values["actor_rollout_ref.actor.optim.lr"] = rec.lr
    if rec.algorithm == "ppo":
        critic_mini = P // critic_mb
        values["critic.ppo_mini_batch_size"] = critic_mini
        values["critic.ppo_micro_batch_size_per_gpu"] = rec.micro_batch_per_gpu or critic_mini * G // dp
        if rec.critic_lr_or_actor():
            values["critic.optim.lr"] = rec.critic_lr_or_actor()
    if rec.generation_concurrency:
        values["actor_rollout_ref.rollout.max_num_seqs"] = rec.generation_concurrency
    if rec.gpu_memory_utilization:
        values["actor_rollout_ref.rollout.gpu_memory_utilization"] = rec.gpu_memory_utilization
    values["trainer.n_gpus_per_node"] = node_gpus
    values["trainer.nnodes"] = nodes
    extra, async_notes = verl_async(rec, async_trainer, rollout_gpus, per_node)
    values.update(extra)
    notes = [
        f"{P} prompts x {G} = {P * G} responses per step; {rec.updates_per_batch} actor update(s) per step",
        "ppo_mini_batch_size is in prompts (verl multiplies by rollout.n); the micro-batch is in responses",
    ]
    notes += micro_note("ppo_micro_batch_size_per_gpu", per_gpu, rec.micro_batch_per_gpu)
    if not rec.lr_known:
        notes.append(UNKNOWN_LR_NOTE)
    if rec.generation_concurrency:
        notes.append("rollout.max_num_seqs is per inference engine (one per tensor-parallel group)")
    notes += split_notes + async_notes
    module = VERL_MODULES[async_trainer] if rec.off_policy else "verl.trainer.main_ppo"
    lines = [f"python3 -m {module} \\"]
    lines += [f"    {k}={_hydra(v)} \\" for k, v in values.items()]
    lines.append("    ...  # your model, data and reward settings")
    return EmittedConfig("verl", commented("\n".join(lines) + "\n", notes), values, tuple(notes))


def _hydra(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)
