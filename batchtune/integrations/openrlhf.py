"""OpenRLHF: its log keys (read through TensorBoard or W&B) and its ``train_ppo_ray`` flags.

Logging: ``--logger.tensorboard_dir DIR`` (0.10.2; ``--use_tensorboard`` before) writes scalars
``train/<key>`` (reward, policy_loss, actor_lr, critic_loss, critic_lr, kl, response_length, ...)
against the global step, one step per rollout batch of ``rollout.batch_size`` prompts x
``n_samples_per_prompt`` responses; evaluation scalars go to ``eval/<key>``.

Units: ``rollout.batch_size`` is P (prompts), ``n_samples_per_prompt`` is G, ``train.batch_size`` is
the optimiser batch in responses (so P*G / train.batch_size updates per rollout batch, for actor and
critic alike) and ``train.micro_batch_size`` is responses per GPU per forward/backward. Flag names
verified against OpenRLHF 0.10.2's hierarchical CLI (docs "Flag migration (0.9.x / early 0.10 ->
0.10.2)") and, for ``legacy_flags=True``, the flat names of ``openrlhf/cli/train_ppo_ray.py`` before it.
"""

from __future__ import annotations

from batchtune.errors import InputError
from batchtune.integrations.common import (
    LogKeys,
)
from batchtune.integrations.emit_async import async_split, node_layout, openrlhf_async
from batchtune.integrations.emit_base import (
    UNKNOWN_LR_NOTE,
    EmittedConfig,
    RecommendationInput,
    check_recommendation,
    commented,
    micro_note,
    unfit_hint,
)

OPENRLHF_KEYS = LogKeys(
    # evaluation logs eval_<dataset>_pass1, _pass<n>, lengths and truncation rates
    # (openrlhf/trainer/ppo_trainer.py, v0.9.10-v0.11.0): pass@1 of the one eval dataset
    metrics={
        "reward": ("train/reward",),
        "eval_reward": ("eval/eval_*_pass1",),
        "loss": ("train/policy_loss",),
        "sync_s": ("train/timing/broadcast",),  # the weights to the vLLM engines, every step
    },
    grad_norm=("train/actor_grad_norm", "train/grad_norm"),
    critic_grad_norm=("train/critic_grad_norm",),
    lr=("train/actor_lr",),
    # its own timing (status["timing/..."], logged under train/): generation, the PPO update and
    # the whole step; the rest (reward, reference, broadcast) is other_s
    gen_s=("train/timing/generation",),
    train_s=("train/timing/ppo_train",),
    step_s=("train/timing/step_total",),
    response_length=("train/response_length",),
)

# hierarchical (0.10.2+) name -> flat name (0.9.x and early 0.10)
_LEGACY = {
    "--rollout.batch_size": "--rollout_batch_size",
    "--rollout.n_samples_per_prompt": "--n_samples_per_prompt",
    "--train.batch_size": "--train_batch_size",
    "--train.micro_batch_size": "--micro_train_batch_size",
    "--actor.adam.lr": "--actor_learning_rate",
    "--critic.adam.lr": "--critic_learning_rate",
    "--vllm.gpu_memory_utilization": "--vllm_gpu_memory_utilization",
    "--algo.advantage.estimator": "--advantage_estimator",
    "--actor.num_gpus_per_node": "--actor_num_gpus_per_node",
    "--actor.num_nodes": "--actor_num_nodes",
}


def _openrlhf_problem(P: int, G: int, mini_batches: int, dp: int, micro: int) -> str:
    """Why OpenRLHF would reject or distort this batch on ``dp`` actor GPUs, or "".

    Rules: the rollout batch (P*G responses) splits into whole optimiser batches; DeepSpeed needs
    train_batch_size = micro * accumulation * data-parallel size exactly; train_ppo_ray asserts
    n_samples_per_prompt * rollout_batch_size >= the number of actor processes.
    """
    responses = P * G
    if responses < dp:
        return f"{responses} responses per rollout are fewer than {dp} actor GPUs"
    if responses % mini_batches:
        return f"{responses} responses do not split into {mini_batches} equal optimiser batches"
    train_batch = responses // mini_batches
    if train_batch % dp:
        return f"train.batch_size={train_batch} responses is not divisible by {dp} GPUs"
    if micro and (train_batch // dp) % micro:
        return (
            f"train.batch_size per GPU ({train_batch // dp}) is not divisible by "
            f"train.micro_batch_size={micro}"
        )
    return ""


def emit_openrlhf(
    rec: RecommendationInput, num_gpus: int, legacy_flags: bool = False, gpus_per_node: int = 0
) -> EmittedConfig:
    """Flags for ``python3 -m openrlhf.cli.train_ppo_ray`` (actor on ``num_gpus`` GPUs, colocated)."""
    check_recommendation(rec, num_gpus)
    if legacy_flags and (rec.off_policy or rec.epochs > 1):
        raise InputError(
            "the async and epoch flags are emitted for OpenRLHF >= 0.10.2 only (checked against 0.11.2): "
            "drop legacy_flags"
        )
    rollout_gpus, num_gpus, split_notes = async_split(rec, num_gpus)  # the actor trains on the rest
    P, G = rec.prompts, rec.group_size
    critic_mb = rec.critic_mini_batches or rec.mini_batches
    if rec.algorithm == "ppo" and critic_mb != rec.mini_batches:
        raise InputError(
            "OpenRLHF uses one --train.batch_size for actor and critic; the critic cannot take "
            f"{critic_mb} mini-batches while the actor takes {rec.mini_batches} (emit verl instead, or "
            "set critic_mini_batches equal to mini_batches)"
        )
    problem = _openrlhf_problem(P, G, rec.mini_batches, num_gpus, rec.micro_batch_per_gpu)
    if problem:
        per_gpu = P * G // rec.mini_batches // num_gpus
        hint = unfit_hint(
            _openrlhf_problem, rec, num_gpus, rec.mini_batches, "train.micro_batch_size", per_gpu,
            "rollout.batch_size",
        )  # fmt: skip
        raise InputError(f"OpenRLHF cannot run P={P} x G={G} on {num_gpus} GPUs: {problem}{hint}")
    per_node = min(gpus_per_node or num_gpus, num_gpus)
    if rollout_gpus:
        _, per_node = node_layout(num_gpus, gpus_per_node or num_gpus + rollout_gpus, "actor")
    elif num_gpus % per_node:
        raise InputError(f"{num_gpus} GPUs do not fill nodes of {per_node}; give a multiple of {per_node}")
    train_batch = P * G // rec.mini_batches
    micro = rec.micro_batch_per_gpu or train_batch // num_gpus
    values: dict[str, object] = {
        "--algo.advantage.estimator": "gae" if rec.algorithm == "ppo" else "group_norm",
        "--rollout.batch_size": P,
        "--rollout.n_samples_per_prompt": G,
        "--train.batch_size": train_batch,
        "--train.micro_batch_size": micro,
        "--actor.num_nodes": num_gpus // per_node,
        "--actor.num_gpus_per_node": per_node,
    }
    if rec.lr_known:
        values["--actor.adam.lr"] = rec.lr
    if rec.algorithm == "ppo" and rec.critic_lr_or_actor():
        values["--critic.adam.lr"] = rec.critic_lr_or_actor()
    if rec.gpu_memory_utilization:
        values["--vllm.gpu_memory_utilization"] = rec.gpu_memory_utilization
    async_values, async_notes = openrlhf_async(rec, rollout_gpus)
    values.update(async_values)
    if legacy_flags:
        values = {_LEGACY.get(k, k): v for k, v in values.items()}
        # 0.9.x asserts n_samples_per_prompt * rollout_batch_size // micro_rollout_batch_size >= actor
        # GPUs, with a default of 8 (0.10.2+: 1): at the training micro-batch it always holds, since
        # P*G >= train_batch_size = micro x accumulation x GPUs (read in 0.9.10's train_ppo_ray.py)
        values["--micro_rollout_batch_size"] = micro
    constant = (
        "set --lr_scheduler constant (one scheduler for actor and critic before 0.10.2)"
        if legacy_flags
        else "set --actor.lr_scheduler constant (and --critic.lr_scheduler)"
    )
    notes = [
        f"{P} prompts x {G} = {P * G} responses per rollout; "
        f"{rec.updates_per_batch} optimiser step(s) per rollout",
        f"{constant} to keep the LR the probe measured (the default decays it: cosine_with_min_lr)",
    ]
    notes += split_notes + async_notes
    notes += micro_note("train.micro_batch_size", train_batch // num_gpus, rec.micro_batch_per_gpu)
    if not rec.lr_known:
        notes.append(UNKNOWN_LR_NOTE)
    if rec.generation_concurrency:
        notes.append(
            f"generation_concurrency={rec.generation_concurrency}: OpenRLHF has no per-engine sequence cap "
            "flag; vLLM schedules the whole rollout batch"
        )
    lines = ["python3 -m openrlhf.cli.train_ppo_ray \\"]
    lines += [f"    {k} {_flag(v)} \\" if v is not True else f"    {k} \\" for k, v in values.items()]
    lines.append("    ...  # models, data, reward and placement flags")
    return EmittedConfig("openrlhf", commented("\n".join(lines) + "\n", notes), values, tuple(notes))


def _flag(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)
