"""An off-policy / async pick (staleness k, updates per batch u, mode, sync_every, in-flight cap,
GPU split) in each trainer's own keys, for verl.py, trl.py and openrlhf.py.

batchtune's units (docs/trainer.md "Off-policy knobs"): a trainer step consumes one rollout batch of
P prompts x G responses with u = mini_batches x epochs optimiser updates (epochs pass over all the
mini-batches in turn); a batch trained at step s was generated with the weights after step s-1-k;
weights go to the rollout side every ``sync_every`` steps; at most ``in_flight_cap`` finished batches
wait. What each trainer calls these, read from the installed sources (verl 0.9.1, trl 1.16,
OpenRLHF 0.11.2):

- verl V1 (``verl.trainer.main_ppo``, ``trainer.use_v1`` is on by default): ``trainer.v1.trainer_mode``
  colocate_async (mode sync) or separate_async (mode async: ``actor_rollout_ref.hybrid_engine=False``,
  rollout GPUs in ``actor_rollout_ref.rollout.nnodes/n_gpus_per_node``); ``num_warmup_batches`` = k
  batches generated ahead; ``trainer.v1.sampler.max_off_policy_threshold`` = k + 1 (it counts the
  versions a trajectory spans, both ends); separate_async asserts
  ``train_batch_size == parameter_sync_step * ppo_mini_batch_size`` (trainer_separate_async.py).
- verl fully_async (``verl.experimental.fully_async_policy.fully_async_main``): the trainer takes
  ``require_batches * ppo_mini_batch_size`` prompts per local update and syncs after
  ``trigger_parameter_sync_step`` of them, so one sync interval is ``sync_every * P`` prompts;
  ``staleness_threshold`` is the share of a sync interval generated ahead, ``(k + 1 - sync_every) /
  sync_every``; it asserts ``data.train_batch_size == 0`` and ``data.gen_batch_size == 1``.
- verl one-step-off (``verl.experimental.one_step_off_policy.main_ppo``): k = 1, a sync every step.
- TRL: ``GRPOConfig.num_iterations`` = epochs; a stale pick takes ``trl.experimental.async_grpo.
  AsyncGRPOConfig`` (``max_staleness`` in weight versions, ``weight_sync_steps`` in optimiser steps,
  ``queue_maxsize`` in completions); it uses each completion once, so it cannot take epochs > 1.
- OpenRLHF: ``--train.async_enable`` with ``--train.async_queue_size`` batches generated ahead (the
  generator takes a slot per batch and the trainer frees it before training: lag = queue size),
  ``--train.partial_rollout_enable`` (asserts async_enable), ``--train.max_epochs`` = epochs; it
  broadcasts weights after every step.
"""

from __future__ import annotations

import math

from batchtune.errors import InputError
from batchtune.integrations.emit_base import RecommendationInput

VERL_V1 = "v1"
VERL_FULLY_ASYNC = "fully_async"
VERL_ONE_STEP_OFF = "one_step_off"
VERL_ASYNC_TRAINERS = (VERL_V1, VERL_FULLY_ASYNC, VERL_ONE_STEP_OFF)
VERL_MODULES = {
    VERL_V1: "verl.trainer.main_ppo",
    VERL_FULLY_ASYNC: "verl.experimental.fully_async_policy.fully_async_main",
    VERL_ONE_STEP_OFF: "verl.experimental.one_step_off_policy.main_ppo",
}


UNCHECKED = {
    "verl": (
        "checked against verl 0.9.1 here: every key composes in its Hydra config (tests marked trainers); "
        "not checked: its start-up assertions, which need its Ray/GPU stack (batchtune applies "
        "train_batch_size == parameter_sync_step * ppo_mini_batch_size, rollout nnodes > 0, a non-naive "
        "checkpoint engine, fully_async's train_batch_size == 0), nor the run itself"
    ),
    "trl": (
        "checked against trl 1.16 here: the config builds (tests marked trainers); not checked: the vLLM "
        "server's own flags (with LoRA, --max-loras >= max_staleness + 2) nor the run itself"
    ),
    "openrlhf": (
        "checked against OpenRLHF 0.11.2 here: its argparse and post-parse assertions take every flag "
        "(tests marked trainers); not checked: the Ray placement of the vLLM engines nor the run itself"
    ),
}


def async_split(rec: RecommendationInput, num_gpus: int) -> tuple[int, int, list[str]]:
    """(rollout GPUs, trainer GPUs, notes). Colocated (mode sync): (0, num_gpus)."""
    if rec.mode != "async":
        return 0, num_gpus, []
    if num_gpus < 2:
        raise InputError(
            "an async pick (mode='async') generates and trains on separate GPUs: give --gpus 2 or more "
            "(by API, RecommendationInput(mode='sync') emits its colocated form)"
        )
    if rec.rollout_gpus:
        return rec.rollout_gpus, num_gpus - rec.rollout_gpus, [rec.split_from] if rec.split_from else []
    half = num_gpus // 2
    note = (
        f"the pick names no rollout:train split: {half}:{num_gpus - half} emitted; move GPUs to the side "
        "whose idle ratio is lower (verl: rollouter/idle_ratio vs trainer/idle_ratio)"
    )
    return half, num_gpus - half, [note]


def node_layout(gpus: int, per_node: int, who: str) -> tuple[int, int]:
    """(nodes, GPUs per node) for ``gpus`` GPUs on nodes of ``per_node``."""
    if gpus <= per_node:
        return 1, gpus
    if gpus % per_node:
        raise InputError(
            f"{gpus} {who} GPUs do not fill nodes of {per_node} (a side on more than one node takes whole "
            "nodes)"
        )
    return gpus // per_node, per_node


def staleness_threshold(rec: RecommendationInput) -> float:
    """verl fully_async's share of a sync interval generated ahead, for a lag bound of k steps."""
    return round((rec.staleness + 1 - rec.sync_every) / rec.sync_every, 3)


def fully_async_batches(rec: RecommendationInput) -> tuple[int, int]:
    """(require_batches, trigger_parameter_sync_step). One epoch: one mini-batch per local update
    (verl's streaming advice), m x sync_every of them per sync; several epochs: the whole batch per
    local update, so its ppo_epochs pass over all m mini-batches in turn as batchtune's do."""
    m = rec.mini_batches
    if rec.epochs == 1:
        return 1, m * rec.sync_every
    return m, rec.sync_every


def verl_async(
    rec: RecommendationInput, variant: str, rollout_gpus: int, per_node: int
) -> tuple[dict[str, object], list[str]]:
    """The async keys for ``variant`` (added after the sync keys), and the notes."""
    if variant not in VERL_ASYNC_TRAINERS:
        raise InputError(f"unknown verl async trainer {variant!r}; choose {', '.join(VERL_ASYNC_TRAINERS)}")
    values: dict[str, object] = {}
    if rec.epochs != 1:
        values["actor_rollout_ref.actor.ppo_epochs"] = rec.epochs
        if rec.algorithm == "ppo":
            values["critic.ppo_epochs"] = rec.epochs
    if not rec.off_policy:
        return values, [UNCHECKED["verl"]] if values else []
    values["actor_rollout_ref.rollout.calculate_log_probs"] = True
    values["algorithm.rollout_correction.bypass_mode"] = True  # ratio against the behaviour log-probs
    if variant == VERL_V1:
        v, notes = _verl_v1(rec, rollout_gpus, per_node)
    elif variant == VERL_FULLY_ASYNC:
        v, notes = _verl_fully_async(rec, rollout_gpus, per_node)
    else:
        v, notes = _verl_one_step_off(rec, rollout_gpus, per_node)
    values.update(v)
    notes.append(UNCHECKED["verl"])
    if variant != VERL_FULLY_ASYNC and rec.mode == "async":
        fa, _ = _verl_fully_async(rec, rollout_gpus, per_node)
        keys = " ".join(f"{k}={v}" for k, v in fa.items() if k.startswith(("async_training.", "data.")))
        notes.append(
            f"the same pick for verl's experimental fully_async trainer "
            f"({VERL_MODULES[VERL_FULLY_ASYNC]}): {keys}"
        )
    return values, notes


def _verl_v1(
    rec: RecommendationInput, rollout_gpus: int, per_node: int
) -> tuple[dict[str, object], list[str]]:
    k = rec.staleness
    mode = "separate_async" if rec.mode == "async" else "colocate_async"
    values: dict[str, object] = {
        "trainer.v1.trainer_mode": mode,
        f"trainer.v1.{mode}.num_warmup_batches": k,
        "trainer.v1.sampler.max_off_policy_threshold": k + 1,
    }
    notes = [
        f"verl V1 {mode}: {k} batch(es) generated ahead (num_warmup_batches), a trajectory spans at most "
        f"{k + 1} weight versions (max_off_policy_threshold counts both ends); "
        "partial rollout is always on in V1"
    ]
    if rec.mode == "async":
        values[f"trainer.v1.{mode}.parameter_sync_step"] = rec.mini_batches
        values["actor_rollout_ref.hybrid_engine"] = False
        nodes, gpn = node_layout(rollout_gpus, per_node, "rollout")
        values["actor_rollout_ref.rollout.nnodes"] = nodes
        values["actor_rollout_ref.rollout.n_gpus_per_node"] = gpn
        values["actor_rollout_ref.rollout.checkpoint_engine.backend"] = "nccl"
        notes.append(
            f"separate_async: parameter_sync_step={rec.mini_batches} local updates of ppo_mini_batch_size "
            "per step (verl asserts train_batch_size == parameter_sync_step * ppo_mini_batch_size); "
            "hybrid_engine=False keeps the rollout GPUs apart; the NCCL checkpoint engine (naive is refused)"
        )
        if rec.epochs > 1 and rec.mini_batches > 1:
            notes.append(
                "separate_async runs ppo_epochs within each local update (mini-batch 1 twice, then 2), "
                "not epoch by epoch over the batch as the probe did"
            )
    if rec.sync_every > 1:
        notes.append(
            f"V1 syncs weights after every step, not every {rec.sync_every}: the lag stays within k={k}"
        )
    if rec.in_flight_cap:
        notes.append(
            f"in_flight_cap={rec.in_flight_cap}: V1 has no queue cap of its own; num_warmup_batches bounds it"
        )
    return values, notes


def _verl_fully_async(
    rec: RecommendationInput, rollout_gpus: int, per_node: int
) -> tuple[dict[str, object], list[str]]:
    if rec.mode != "async":
        raise InputError(
            "verl's fully_async trainer generates on its own GPUs: it needs mode='async' with a GPU split "
            "(a colocated stale pick is V1's colocate_async: async_trainer='v1')"
        )
    require, trigger = fully_async_batches(rec)
    mini = rec.prompts // rec.mini_batches
    assert trigger * require * mini == rec.sync_every * rec.prompts  # one sync interval, in prompts
    nodes, gpn = node_layout(rollout_gpus, per_node, "rollout")
    values: dict[str, object] = {
        "data.train_batch_size": 0,
        "data.gen_batch_size": 1,
        "async_training.staleness_threshold": staleness_threshold(rec),
        "async_training.trigger_parameter_sync_step": trigger,
        "async_training.require_batches": require,
        "async_training.partial_rollout": rec.partial_rollout,
        "actor_rollout_ref.hybrid_engine": False,
        "rollout.nnodes": nodes,
        "rollout.n_gpus_per_node": gpn,
    }
    if rec.generation_concurrency:
        values["async_training.concurrent_samples_per_replica"] = max(
            1, rec.generation_concurrency // rec.group_size
        )
    notes = [
        f"fully_async: {require} x ppo_mini_batch_size={mini} prompts per local update, "
        f"a sync every {trigger} "
        f"(= {rec.sync_every} x {rec.prompts} prompts, the probe's sync interval); staleness_threshold = "
        f"(k + 1 - sync_every) / sync_every for k={rec.staleness}",
        "fully_async: data.train_batch_size=0 and gen_batch_size=1 (it asserts both); set "
        "rollout.total_rollout_steps to your prompt budget (verl's default is 100 prompts)",
    ]
    if rec.in_flight_cap:
        notes.append(
            f"in_flight_cap={rec.in_flight_cap}: fully_async's queue holds (1 + staleness_threshold) sync "
            "intervals; it has no cap of its own"
        )
    return values, notes


def _verl_one_step_off(
    rec: RecommendationInput, rollout_gpus: int, per_node: int
) -> tuple[dict[str, object], list[str]]:
    if rec.mode != "async" or rec.staleness != 1 or rec.sync_every != 1:
        raise InputError(
            "verl's one-step-off trainer is exactly staleness 1, a sync every step, on separate GPUs "
            f"(mode='async'); this pick is k={rec.staleness}, sync_every={rec.sync_every}, mode={rec.mode!r}"
        )
    nodes, gpn = node_layout(rollout_gpus, per_node, "rollout")
    values: dict[str, object] = {
        "actor_rollout_ref.hybrid_engine": False,
        "rollout.nnodes": nodes,
        "rollout.n_gpus_per_node": gpn,
    }
    note = "one-step-off: run from verl's source root (its config's searchpath is file://verl/trainer/config)"
    return values, [note]


# ---- TRL ------------------------------------------------------------------------------------------


def trl_async(
    rec: RecommendationInput, rollout_gpus: int, num_gpus: int
) -> tuple[dict[str, object], list[str]]:
    """AsyncGRPOConfig's pipeline fields for a stale pick."""
    if rec.epochs > 1:
        raise InputError(
            f"TRL's AsyncGRPOTrainer uses each completion once: a stale pick with epochs={rec.epochs} "
            "(updates_per_batch = mini_batches x epochs) cannot be written for it; emit verl or openrlhf"
        )
    steps = rec.mini_batches * rec.sync_every  # optimiser steps per weight sync
    values: dict[str, object] = {
        "max_staleness": math.ceil(rec.staleness / rec.sync_every),
        "weight_sync_steps": steps,
        "queue_maxsize": rec.cap * rec.batch_responses,
    }
    if rec.generation_concurrency:
        values["max_inflight_tasks"] = rec.generation_concurrency
    side = (
        f"{rollout_gpus} GPU(s) for `trl vllm-serve`, {num_gpus - rollout_gpus}"
        if rollout_gpus
        else f"{num_gpus}"
    )
    notes = [
        f"AsyncGRPOConfig (trl.experimental.async_grpo, trl 1.16): versions advance every weight_sync_steps="
        f"{steps} optimiser steps; a completion older than max_staleness={values['max_staleness']} "
        "versions is "
        f"dropped; queue_maxsize counts completions ({rec.cap} batch(es) of {rec.batch_responses})",
        f"run it against a vLLM server: {side} training process(es) (accelerate launch --num_processes)",
    ]
    if rec.generation_concurrency:
        notes.append("max_inflight_tasks counts completions in flight at the vLLM server (one task each)")
    return values, [*notes, UNCHECKED["trl"]]


# ---- OpenRLHF -------------------------------------------------------------------------------------


def openrlhf_async(rec: RecommendationInput, rollout_gpus: int) -> tuple[dict[str, object], list[str]]:
    """Flags after the sync ones: epochs, and for a stale pick the async pipeline."""
    values: dict[str, object] = {}
    if rec.epochs != 1:
        values["--train.max_epochs"] = rec.epochs
    if rec.staleness == 0:  # on-policy: OpenRLHF's sync mode, vLLM engines on GPUs of their own
        if not rollout_gpus:
            return values, [UNCHECKED["openrlhf"]] if values else []
        values["--vllm.num_engines"] = rollout_gpus
        engines = f"--vllm.num_engines={rollout_gpus}: one engine per rollout GPU (tensor parallel 1)"
        return values, [engines, UNCHECKED["openrlhf"]]
    queue = max(1, min(rec.staleness, rec.in_flight_cap) if rec.in_flight_cap else rec.staleness)
    values["--train.async_enable"] = True
    values["--train.async_queue_size"] = queue
    if rec.partial_rollout:
        values["--train.partial_rollout_enable"] = True
    if rollout_gpus:
        values["--vllm.num_engines"] = rollout_gpus
    notes = [
        f"async: the generator runs up to --train.async_queue_size={queue} batch(es) ahead (lag {queue}); "
        "OpenRLHF broadcasts weights after every step"
        + (f" (not every {rec.sync_every})" if rec.sync_every > 1 else ""),
    ]
    if rollout_gpus:
        notes.append(
            f"--vllm.num_engines={rollout_gpus} assumes tensor parallel 1 "
            "(engines x --vllm.tensor_parallel_size "
            "rollout GPUs); async vLLM engines take their own GPUs"
        )
    else:
        notes.append("async vLLM engines need GPUs of their own: add --vllm.num_engines for the rollout side")
    return values, [*notes, UNCHECKED["openrlhf"]]
