"""The off-policy side of a trainer config, for `batchtune check`: staleness k (trainer steps of lag),
updates per rollout batch u (mini-batches x epochs) and whether generation runs on GPUs of its own,
read back from the keys integrations/emit_async.py writes (and the trainers' defaults where a key is
absent, from verl 0.9.1, trl 1.16, OpenRLHF 0.11.2):

- verl V1 (``trainer.v1.trainer_mode`` colocate_async / separate_async): k =
  ``trainer.v1.<mode>.num_warmup_batches`` (default 1); u = mini-batches x ``ppo_epochs``.
  fully_async (any ``async_training.*`` key) has no rollout batch (its data.train_batch_size is 0):
  read alone, the batch is one sync interval, ``trigger_parameter_sync_step x require_batches x
  ppo_mini_batch_size`` prompts (defaults 4, 1, 256), k = ``staleness_threshold`` (default 0.1:
  a share of an interval), u = trigger x require x ``ppo_epochs``; it is kept in its own units
  (``FullyAsyncInterval``) for `check` to read in a probe's rollout batches.
- TRL: u = ``steps_per_generation / gradient_accumulation_steps x num_iterations``; an
  AsyncGRPOConfig (``max_staleness`` set) has no rollout batch: it is read in optimiser steps here
  (k = max_staleness x ``weight_sync_steps`` optimiser steps, one update per completion), and kept
  in its own units (``AsyncGrpoSteps``) for `check` to read in a probe's rollout batches
  (``in_rollout_batches``, with the probe's weight sync interval).
- OpenRLHF: u = P*G / ``--train.batch_size`` x ``--train.max_epochs``; with ``--train.async_enable``,
  k = ``--train.async_queue_size`` (default 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from batchtune.errors import InputError
from batchtune.integrations.config_files import Flat

VERL_PPO_MINI = 256  # actor.ppo_mini_batch_size's default (actor.yaml)
VERL_FULLY_ASYNC = {  # async_training defaults (verl 0.9.0 fully_async_ppo_trainer.yaml)
    "trigger_parameter_sync_step": 4,
    "require_batches": 1,
    "staleness_threshold": 0.1,
    "concurrent_samples_per_replica": 16,
}
TRUE = ("true", "1", "yes", "y", "t")


@dataclass(frozen=True)
class AsyncGrpoSteps:
    """An AsyncGRPOConfig in its own units (trl 1.16 trl/experimental/async_grpo): each optimiser step
    trains ``completions_per_step`` = per_device_train_batch_size x gradient_accumulation_steps x
    processes completions, once each; the version the vLLM server generates with advances every
    ``weight_sync_steps`` optimiser steps; a completion more than ``max_staleness`` versions old is
    dropped. It has no rollout batch, steps_per_generation nor num_iterations."""

    name: ClassVar[str] = "TRL AsyncGRPO"
    completions_per_step: int
    max_staleness: float
    weight_sync_steps: float


@dataclass(frozen=True)
class FullyAsyncInterval:
    """A verl fully_async config in its own units (verl 0.9.1 experimental/fully_async_policy, as
    emit_async._verl_fully_async writes it): the trainer syncs weights after one interval of
    ``interval_prompts`` = trigger_parameter_sync_step x require_batches x ppo_mini_batch_size
    prompts of ``group_size`` responses, trained with ``updates`` = trigger x require x ppo_epochs
    optimiser updates; ``staleness_threshold`` of an interval may be generated ahead of it; each
    rollout engine (replica) takes at most ``samples_per_replica`` prompts at once."""

    name: ClassVar[str] = "verl fully_async"
    interval_prompts: int
    group_size: int
    updates: float
    staleness_threshold: float
    samples_per_replica: float = VERL_FULLY_ASYNC["concurrent_samples_per_replica"]

    def prompts_in_flight(self, engines: int) -> int:
        """The prompts (of ``group_size`` responses each) its rollouter generates at once over
        ``engines`` engines. It streams one prompt at a time, with no step's batch: at most
        max_concurrent_samples = min(replicas x concurrent_samples_per_replica, max_required_samples)
        at once, where max_required_samples = int(ppo_mini_batch_size x require_batches x (1 +
        staleness_threshold) x trigger_parameter_sync_step) is what it may start between two syncs
        (verl 0.9.0 fully_async_rollouter.py, set_max_required_samples and _should_pause_generation)."""
        ahead = int(self.interval_prompts * (1 + self.staleness_threshold))
        return max(1, min(engines * int(self.samples_per_replica), ahead))

    def in_flight_text(self, engines: int) -> str:
        """``prompts_in_flight`` in words, for check's note."""
        return (
            f"verl fully_async streams prompts, no step's batch: min({engines} engines x "
            f"concurrent_samples_per_replica={self.samples_per_replica:g}, (1 + staleness_threshold="
            f"{self.staleness_threshold:g}) x {self.interval_prompts} prompts of a sync interval) = "
            f"{self.prompts_in_flight(engines)} prompts, {self.prompts_in_flight(engines) * self.group_size} "
            "responses, in flight"
        )


@dataclass(frozen=True)
class RolloutBatches:
    """An async config in a probe's units (``in_rollout_batches``): a rollout batch of
    ``batch_responses``, ``updates_per_batch`` optimiser steps on it, staleness k in rollout batches
    between ``staleness_lo`` and ``staleness_hi`` (one value unless weights sync every few batches;
    fractional where a verl staleness_threshold names no whole k)."""

    batch_responses: int
    updates_per_batch: int
    staleness_lo: float
    staleness_hi: float
    how: str  # the reading in words, for check's note


def in_rollout_batches(units: AsyncGrpoSteps | FullyAsyncInterval, sync_every: int) -> RolloutBatches | str:
    """A config kept in its own units read as a probe whose weights sync every ``sync_every`` rollout
    batches; or why it cannot be."""
    if isinstance(units, FullyAsyncInterval):
        return _interval_in_rollout_batches(units, sync_every)
    return _steps_in_rollout_batches(units, sync_every)


def _interval_in_rollout_batches(iv: FullyAsyncInterval, sync_every: int) -> RolloutBatches | str:
    """The inverse of emit_async._verl_fully_async, which writes a candidate of P prompts at staleness
    k and u updates per batch, synced every s = ``sync_every`` batches, as an interval of s x P prompts
    with s x u updates and staleness_threshold = (k + 1 - s) / s rounded to 3 places: P = interval / s,
    u = updates / s, k = threshold x s + s - 1 (the nearest whole k within that rounding)."""
    t, s, n, up = iv.staleness_threshold, sync_every, iv.interval_prompts, iv.updates
    if not (math.isfinite(t) and t >= 0 and math.isfinite(up) and up == int(up)):
        return f"staleness_threshold={t:g} (>= 0) and {up:g} updates per sync interval (whole) do not fit"
    if n % s or int(up) % s:
        return (
            f"a sync interval of {n} prompts and {int(up)} updates is no whole number of the probe's "
            f"rollout batches at its weight sync every {s} batch(es)"
        )
    p, u, k = n // s, int(up) // s, t * s + s - 1
    k = float(round(k)) if abs(k - round(k)) <= 5e-4 * s + 1e-9 else k
    how = (
        f"verl fully_async in the probe's rollout batches (weights synced every {s} batch(es)): a sync "
        f"interval of {n} prompts and {int(up)} update(s) is {s} batch(es) of P = {p} prompts with "
        f"u = {u}; staleness_threshold={t:g} of it is k = {t:g} x {s} + {s - 1} = {k:g}"
    )
    return RolloutBatches(p * iv.group_size, u, k, k, how)


def _steps_in_rollout_batches(steps: AsyncGrpoSteps, sync_every: int) -> RolloutBatches | str:
    """The inverse of emit_async.trl_async, which writes a candidate P x G at staleness k and
    u = mini-batches m (epochs 1: AsyncGRPO uses each completion once) as completions per step
    P*G/m, ``weight_sync_steps`` = m x sync_every and ``max_staleness`` = ceil(k / sync_every):
    B = m x completions per step, u = m = weight_sync_steps / sync_every, and k any value with
    ceil(k / sync_every) = max_staleness, no less than sync_every - 1 (a bound the sync can keep)."""
    w, v, s = steps.weight_sync_steps, steps.max_staleness, sync_every
    if not (math.isfinite(w) and math.isfinite(v)) or w != int(w) or w < 1 or v != int(v) or v < 0:
        return f"weight_sync_steps={w:g} and max_staleness={v:g} are not whole numbers (>= 1, >= 0)"
    if int(w) % s:
        return (
            f"weight_sync_steps={int(w)} is not a multiple of the probe's weight sync every {s} rollout "
            f"batches (u = weight_sync_steps / {s} optimiser steps per batch)"
        )
    m, v = int(w) // s, int(v)
    lo, hi = (0, 0) if v == 0 else (max((v - 1) * s + 1, s - 1), v * s)
    k = f"{lo}" if lo == hi else f"{lo}-{hi}"
    how = (
        f"TRL AsyncGRPO in the probe's rollout batches (weights synced every {s} batch(es)): "
        f"weight_sync_steps={int(w)} is u = {m} optimiser step(s) of {steps.completions_per_step} "
        f"completions per batch, B = {m * steps.completions_per_step}; max_staleness={v} version(s) "
        f"is k = {k}"
    )
    return RolloutBatches(m * steps.completions_per_step, m, lo, hi, how)


@dataclass(frozen=True)
class AsyncReading:
    staleness: float  # trainer steps (rollout batches) of lag; fractional for verl's staleness_threshold
    updates_per_batch: float  # optimiser updates per rollout batch
    mode: str  # sync: generation and training share the GPUs | async: separate GPUs
    notes: tuple[str, ...] = ()
    prompts: int | None = None  # verl fully_async: the batch it implies (its data.train_batch_size is 0)
    own_units: AsyncGrpoSteps | FullyAsyncInterval | None = None  # for check to read in a probe's units


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


def _count(flat: Flat, path: Path, *names: str, default: float, least: int = 1, whole: bool = True) -> float:
    """The first of ``names`` present, a count (steps, batches, epochs, a batch size), else ``default``;
    below ``least`` (0 where a count of none has a meaning), a fraction (``whole``) or a non-number is
    bad input naming its line (a sync interval of 0 divided by zero in check, a count of 0 updates
    was priced). A ``null`` is not set (YAML's spelling of the default: TRL's ``steps_per_generation``)."""
    for name in names:
        if (got := number_at(flat, path, name)) is None:
            continue
        value, where = got
        if not (math.isfinite(value) and value >= least and (value == int(value) or not whole)):
            what = f"a {'whole ' if whole else ''}number >= {least}"
            what = "a positive whole number" if (least, whole) == (1, True) else what
            raise InputError(f"{where}: {name} = {flat[name][0]!r} must be {what}")
        return value
    return default


def number_at(flat: Flat, path: Path, name: str) -> tuple[float, str] | None:
    """``name``'s value as a number (a bool: NaN) and where it stands (``path:line``); None where it
    is absent or ``null`` (YAML's spelling of the trainer's default); a non-number is bad input."""
    if name not in flat or flat[name][0] is None:
        return None
    raw, line = flat[name]
    where = f"{path}:{line}" if line else str(path)
    try:
        return (math.nan if isinstance(raw, bool) else float(raw)), where
    except (TypeError, ValueError):
        raise InputError(
            f"{where}: {name} = {raw!r} is not a number (interpolations such as ${{...}} are not "
            "resolved: write the value, or pass a generic config)"
        ) from None


def _true(flat: Flat, *names: str) -> bool:
    return any(name in flat and str(flat[name][0]).strip().lower() in TRUE for name in names)


def fully_async_verl(flat: Flat) -> bool:
    return any(k.startswith("async_training.") for k in flat)


def verl_async(flat: Flat, prompts: int | None, group_size: int, path: Path) -> AsyncReading:
    mini = _count(flat, path, "actor_rollout_ref.actor.ppo_mini_batch_size", default=VERL_PPO_MINI)
    epochs = _count(flat, path, "actor_rollout_ref.actor.ppo_epochs", default=1)
    if fully_async_verl(flat):
        a = {k: _get(flat, f"async_training.{k}", default=v) for k, v in VERL_FULLY_ASYNC.items()}
        for key in ("trigger_parameter_sync_step", "require_batches", "concurrent_samples_per_replica"):
            a[key] = _count(flat, path, f"async_training.{key}", default=a[key])
        ahead = "async_training.staleness_threshold"
        a["staleness_threshold"] = _count(
            flat, path, ahead, default=a["staleness_threshold"], least=0, whole=False
        )
        batch = int(a["trigger_parameter_sync_step"] * a["require_batches"] * mini)
        u = a["trigger_parameter_sync_step"] * a["require_batches"] * epochs
        note = (
            f"verl fully_async: one sync interval of trigger_parameter_sync_step x require_batches x "
            f"ppo_mini_batch_size = {batch} prompts, {u:g} update(s); staleness_threshold="
            f"{a['staleness_threshold']:g} of it may be generated ahead"
        )
        t, per_replica = a["staleness_threshold"], a["concurrent_samples_per_replica"]
        units = FullyAsyncInterval(batch, group_size, u, t, per_replica)
        return AsyncReading(a["staleness_threshold"], u, "async", (note,), prompts=batch, own_units=units)
    u = (prompts / mini if prompts and mini < prompts else 1) * epochs
    mode = str(flat.get("trainer.v1.trainer_mode", ("sync", None))[0])
    if mode in ("colocate_async", "separate_async"):
        k = _count(flat, path, f"trainer.v1.{mode}.num_warmup_batches", default=1, least=0)
        bound = _get(flat, "trainer.v1.sampler.max_off_policy_threshold", default=8)
        note = (
            f"verl V1 {mode}: {k:g} batch(es) generated ahead; a trajectory may span "
            f"{bound:g} weight versions (max_off_policy_threshold)"
        )
        return AsyncReading(k, u, "async" if mode == "separate_async" else "sync", (note,))
    if "rollout.nnodes" in flat:  # one-step-off's own block (the V1 keys are under actor_rollout_ref)
        return AsyncReading(1, u, "async", ("verl one-step-off (rollout.nnodes set): staleness 1",))
    return AsyncReading(0, u, "sync")


def trl_async(flat: Flat, processes: int, per_step: int, path: Path) -> AsyncReading:
    """``processes``: the training processes (num_processes, or the config's accelerate launch line);
    ``per_step``: the completions one optimiser step trains (AsyncGRPO's batch as read here)."""

    def num(name: str, default: float, least: int = 1) -> float:  # a count (max_staleness: 0 allowed)
        return _count(flat, path, name, f"--{name}", default=default, least=least)

    if "max_staleness" in flat or "--max_staleness" in flat:
        sync = num("weight_sync_steps", 1)
        versions = num("max_staleness", 4, least=0)  # 0: TRL's strict discard; below, every sample is dropped
        k = versions * sync
        note = (
            f"TRL AsyncGRPO counts optimiser steps: {per_step} completions each (each used once), "
            f"max_staleness x weight_sync_steps = {k:g} optimiser steps of lag"
        )
        steps = AsyncGrpoSteps(per_step, versions, sync)
        return AsyncReading(k, 1, "async", (note,), own_units=steps)
    ga = num("gradient_accumulation_steps", 1)
    spg = num("steps_per_generation", 0)
    if not spg:  # derived from generation_batch_size when given (trl 1.16 GRPOConfig.__post_init__)
        gen = num("generation_batch_size", 0)
        per = num("per_device_train_batch_size", 8) * processes
        spg = gen / per if gen else ga
    return AsyncReading(0, max(spg / ga, 1) * num("num_iterations", 1), "sync")


def openrlhf_async(flat: Flat, responses: int, path: Path) -> AsyncReading:
    train = _get(flat, "--train.batch_size", "--train_batch_size", default=128)
    u = max(responses / train, 1) * _count(flat, path, "--train.max_epochs", "--max_epochs", default=1)
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
