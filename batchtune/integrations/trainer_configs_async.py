"""The off-policy side of a trainer config, for `batchtune check`: staleness k (trainer steps of lag),
updates per rollout batch u (mini-batches x epochs) and whether generation runs on GPUs of its own,
read back from the keys integrations/emit_async.py writes (and the trainers' defaults where a key is
absent, from verl 0.9.1, trl 1.16, OpenRLHF 0.11.2):

- verl V1 (``trainer.v1.trainer_mode`` colocate_async / separate_async): k =
  ``trainer.v1.<mode>.num_warmup_batches`` (default 1); fully_async (any ``async_training.*`` key):
  the batch is one sync interval, ``trigger_parameter_sync_step x require_batches x
  ppo_mini_batch_size`` prompts (defaults 4, 1, 256), k = ``staleness_threshold`` (default 0.1:
  a share of a batch); u = mini-batches x ``ppo_epochs``.
- TRL: u = ``steps_per_generation / gradient_accumulation_steps x num_iterations``; an
  AsyncGRPOConfig (``max_staleness`` set) has no rollout batch: k = max_staleness x
  ``weight_sync_steps`` optimiser steps, one update per completion.
- OpenRLHF: u = P*G / ``--train.batch_size`` x ``--train.max_epochs``; with ``--train.async_enable``,
  k = ``--train.async_queue_size`` (default 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from batchtune.integrations.config_files import Flat

VERL_PPO_MINI = 256  # actor.ppo_mini_batch_size's default (actor.yaml)
VERL_FULLY_ASYNC = {"trigger_parameter_sync_step": 4, "require_batches": 1, "staleness_threshold": 0.1}
TRUE = ("true", "1", "yes", "y", "t")


@dataclass(frozen=True)
class AsyncReading:
    staleness: float  # trainer steps (rollout batches) of lag; fractional for verl's staleness_threshold
    updates_per_batch: float  # optimiser updates per rollout batch
    mode: str  # sync: generation and training share the GPUs | async: separate GPUs
    notes: tuple[str, ...] = ()
    prompts: int | None = None  # verl fully_async: the batch it implies (its data.train_batch_size is 0)


def _get(flat: Flat, *names: str, default: float) -> float:
    for name in names:
        if name in flat:
            raw = flat[name][0]
            if isinstance(raw, bool):
                return float(raw)
            try:
                return float(raw)
            except (TypeError, ValueError):
                return default
    return default


def _true(flat: Flat, *names: str) -> bool:
    return any(name in flat and str(flat[name][0]).strip().lower() in TRUE for name in names)


def fully_async_verl(flat: Flat) -> bool:
    return any(k.startswith("async_training.") for k in flat)


def verl_async(flat: Flat, prompts: int | None) -> AsyncReading:
    mini = _get(flat, "actor_rollout_ref.actor.ppo_mini_batch_size", default=VERL_PPO_MINI)
    epochs = _get(flat, "actor_rollout_ref.actor.ppo_epochs", default=1)
    if fully_async_verl(flat):
        a = {k: _get(flat, f"async_training.{k}", default=v) for k, v in VERL_FULLY_ASYNC.items()}
        batch = int(a["trigger_parameter_sync_step"] * a["require_batches"] * mini)
        note = (
            f"verl fully_async: one sync interval of trigger_parameter_sync_step x require_batches x "
            f"ppo_mini_batch_size = {batch} prompts is read as the batch; staleness_threshold="
            f"{a['staleness_threshold']:g} of it may be generated ahead"
        )
        u = a["trigger_parameter_sync_step"] * a["require_batches"] * epochs
        return AsyncReading(a["staleness_threshold"], u, "async", (note,), prompts=batch)
    u = (prompts / mini if prompts and mini < prompts else 1) * epochs
    mode = str(flat.get("trainer.v1.trainer_mode", ("sync", None))[0])
    if mode in ("colocate_async", "separate_async"):
        k = _get(flat, f"trainer.v1.{mode}.num_warmup_batches", default=1)
        bound = _get(flat, "trainer.v1.sampler.max_off_policy_threshold", default=8)
        note = (
            f"verl V1 {mode}: {k:g} batch(es) generated ahead; a trajectory may span "
            f"{bound:g} weight versions (max_off_policy_threshold)"
        )
        return AsyncReading(k, u, "async" if mode == "separate_async" else "sync", (note,))
    if "rollout.nnodes" in flat:  # one-step-off's own block (the V1 keys are under actor_rollout_ref)
        return AsyncReading(1, u, "async", ("verl one-step-off (rollout.nnodes set): staleness 1",))
    return AsyncReading(0, u, "sync")


def trl_async(flat: Flat, processes: int) -> AsyncReading:
    """``processes``: the training processes (num_processes, or the config's accelerate launch line)."""

    def num(name: str, default: float) -> float:
        return _get(flat, name, f"--{name}", default=default)

    if "max_staleness" in flat or "--max_staleness" in flat:
        sync = num("weight_sync_steps", 1)
        k = num("max_staleness", 4) * sync
        note = (
            f"TRL AsyncGRPO: max_staleness x weight_sync_steps = {k:g} optimiser steps of lag; one "
            "optimiser step's completions are read as the batch (each is used once)"
        )
        return AsyncReading(k, 1, "async", (note,))
    ga = num("gradient_accumulation_steps", 1)
    spg = num("steps_per_generation", 0)
    if not spg:  # derived from generation_batch_size when given (trl 1.16 GRPOConfig.__post_init__)
        gen = num("generation_batch_size", 0)
        per = num("per_device_train_batch_size", 8) * processes
        spg = gen / per if gen else ga
    return AsyncReading(0, max(spg / ga, 1) * num("num_iterations", 1), "sync")


def openrlhf_async(flat: Flat, responses: int) -> AsyncReading:
    train = _get(flat, "--train.batch_size", "--train_batch_size", default=128)
    u = max(responses / train, 1) * _get(flat, "--train.max_epochs", "--max_epochs", default=1)
    if _true(flat, "--train.async_enable"):
        k = _get(flat, "--train.async_queue_size", default=1)
        partial = " with partial rollout" if _true(flat, "--train.partial_rollout_enable") else ""
        return AsyncReading(k, u, "async", (f"OpenRLHF async{partial}: {k:g} batch(es) generated ahead",))
    return AsyncReading(0, u, "sync")


def pick_note(staleness: float, updates: float, pick_k: int, pick_u: int) -> str:
    """A note when the config's off-policy settings are not the evidence's pick (u = 0: not recorded)."""
    same_u = not pick_u or abs(updates - pick_u) < 1e-9
    if abs(staleness - pick_k) < 1e-9 and same_u:
        return ""
    pick = f"staleness {pick_k}" + (f", {pick_u} update(s) per batch" if pick_u else "")
    return (
        f"the config runs staleness {staleness:g} with {updates:g} update(s) per batch; the evidence's pick "
        f"is {pick}: its samples-to-target was measured at the pick's settings"
    )
