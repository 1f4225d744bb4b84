"""What every emitter shares: the winner handed in (RecommendationInput), the config handed out
(EmittedConfig) and the divisibility helpers. The dispatcher over the emitters is `emit.py`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batchtune.errors import InputError

if TYPE_CHECKING:
    from batchtune.analysis.decide.async_rank import AsyncPick

TRAINERS = ("verl", "trl", "openrlhf")
DEFAULT_GPUS_PER_NODE = 8  # the node size --emit assumes unless told (8 GPUs per node is the common box)


# ---- the winner handed to an emitter --------------------------------------------------------------


@dataclass(frozen=True)
class RecommendationInput:
    """The winning configuration in batchtune's units, to be written in a trainer's own units."""

    prompts: int  # P per rollout batch
    group_size: int  # G responses per prompt
    lr: float  # actor LR (peak)
    algorithm: str = "grpo"  # grpo | ppo
    mini_batches: int = 1  # actor optimiser steps per rollout batch (1 keeps policy age fixed)
    critic_lr: float = 0.0  # PPO; 0 = the actor's LR
    critic_mini_batches: int = 0  # PPO critic optimiser steps per rollout batch; 0 = mini_batches
    generation_concurrency: int = 0  # responses decoded at once per inference engine; 0 = engine default
    gpu_memory_utilization: float = 0.0  # inference engine's share of GPU memory; 0 = leave as is
    micro_batch_per_gpu: int = 0  # responses per forward/backward per GPU; 0 = no accumulation
    # off-policy and async (docs/trainer.md "Off-policy knobs"; emit_async.py writes them)
    epochs: int = 1  # passes over the mini-batches: updates per batch u = mini_batches x epochs
    staleness: int = 0  # k: rollouts from the weights of k trainer steps ago (0 = on-policy)
    mode: str = "sync"  # sync: generate and train in turn on the same GPUs | async: separate GPUs
    sync_every: int = 1  # trainer steps between weight syncs to the rollout side (<= staleness + 1)
    in_flight_cap: int = 0  # finished batches queued ahead; 0 = max(staleness, 1)
    rollout_gpus: int = 0  # async: GPUs of num_gpus that generate (the rest train); 0 = not given
    partial_rollout: bool = False  # in-flight responses continue across a weight sync (mixed versions)
    split_from: str = ""  # how rollout_gpus was derived from the ranking's split, when it was scaled

    @property
    def batch_responses(self) -> int:
        return self.prompts * self.group_size

    @property
    def updates_per_batch(self) -> int:
        return self.mini_batches * self.epochs

    @property
    def off_policy(self) -> bool:
        """True when the trainer must run its async / off-policy path: stale rollouts or two sides."""
        return self.staleness > 0 or self.mode == "async"

    @property
    def cap(self) -> int:
        """The in-flight cap in batches, as the built-in async run applies it."""
        return self.in_flight_cap or max(self.staleness, 1)

    @property
    def lr_known(self) -> bool:
        """False for a winner from measurements that give no LR (NaN or 0): the LR is then not emitted."""
        return math.isfinite(self.lr) and self.lr > 0

    def critic_lr_or_actor(self) -> float:
        """The critic LR to emit, 0 when neither it nor the actor's is known."""
        return self.critic_lr or (self.lr if self.lr_known else 0.0)


UNKNOWN_LR_NOTE = (
    "the recommendation carries no learning rate (measurements without LRs): set it yourself, scaled "
    "from your reference run's LR by the batch ratio (sqrt for Adam, docs/method.md §3.1)"
)


@dataclass(frozen=True)
class EmittedConfig:
    """A trainer configuration: ``text`` to paste, ``values`` by the trainer's own parameter names."""

    trainer: str
    text: str
    values: dict[str, object]
    notes: tuple[str, ...] = ()
    # emit_for_recommendation: the async pick as written where it is not the recommendation's (the
    # trainer took another modelled split: its split_note says why); None: as recommended
    pick: AsyncPick | None = None


def commented(text: str, notes: Sequence[str]) -> str:
    """``text`` followed by the notes as ``#`` comment lines (valid in shell and Python alike)."""
    return text + "".join(f"# {n}\n" for n in notes)


def micro_note(name: str, per_gpu: int, micro: int) -> list[str]:
    """When no micro-batch was given, say that the emitted one is the whole per-GPU batch."""
    if micro:
        return []
    options = ", ".join(str(d) for d in divisors(per_gpu)[-8:])
    return [
        f"{name}={per_gpu} is the whole per-GPU batch (no accumulation); "
        f"lower it to what fits memory (a divisor: {options})"
    ]


def check_recommendation(rec: RecommendationInput, num_gpus: int) -> None:
    problems = []
    if rec.prompts <= 0 or rec.group_size <= 0:
        problems.append("prompts and group_size must be positive")
    if rec.lr < 0 or rec.critic_lr < 0:
        problems.append(f"learning rates cannot be negative, got lr={rec.lr} critic_lr={rec.critic_lr}")
    if rec.algorithm not in ("grpo", "ppo"):
        problems.append(f"algorithm must be 'grpo' or 'ppo', got {rec.algorithm!r}")
    if rec.algorithm == "grpo" and rec.group_size < 2:
        problems.append(
            f"GRPO needs at least 2 responses per prompt (rollout.n, num_generations >= 2), "
            f"got group_size={rec.group_size}"
        )
    if rec.mini_batches < 1 or rec.critic_mini_batches < 0:
        problems.append("mini_batches must be at least 1 (critic_mini_batches at least 0)")
    if rec.micro_batch_per_gpu < 0 or rec.generation_concurrency < 0:
        problems.append("micro_batch_per_gpu and generation_concurrency cannot be negative")
    if not 0 <= rec.gpu_memory_utilization <= 1:
        problems.append("gpu_memory_utilization must lie in [0, 1]")
    problems += _async_problems(rec, num_gpus)
    if num_gpus < 1:
        problems.append(f"num_gpus must be at least 1, got {num_gpus}")
    if problems:
        raise InputError("cannot emit a config: " + "; ".join(problems))


def _async_problems(rec: RecommendationInput, num_gpus: int) -> list[str]:
    """The off-policy settings' own rules, as the built-in trainer enforces them (recipe/checks.py)."""
    problems = []
    if rec.epochs < 1 or rec.staleness < 0 or rec.sync_every < 1 or rec.in_flight_cap < 0:
        problems.append("epochs and sync_every must be at least 1; staleness and in_flight_cap at least 0")
    elif rec.sync_every > rec.staleness + 1:
        problems.append(
            f"sync_every={rec.sync_every} needs staleness >= {rec.sync_every - 1} (weights synced every "
            f"{rec.sync_every} steps are up to {rec.sync_every - 1} steps old), got {rec.staleness}"
        )
    if rec.mode not in ("sync", "async"):
        problems.append(f"mode must be 'sync' or 'async', got {rec.mode!r}")
    if rec.rollout_gpus < 0 or (rec.rollout_gpus and rec.rollout_gpus >= num_gpus):
        problems.append(
            f"rollout_gpus={rec.rollout_gpus} must leave GPUs to train on (0 < rollout_gpus < {num_gpus})"
        )
    if rec.rollout_gpus and rec.mode != "async":
        problems.append("rollout_gpus splits the GPUs: it needs mode='async'")
    return problems


def nearest_valid(
    value: int, ok: Callable[[int], bool], limit: int | None = None
) -> tuple[int | None, int | None]:
    """The closest values below and above ``value`` (exclusive) for which ``ok`` holds."""
    limit = limit or max(64, 4 * value)
    below = next((v for v in range(value - 1, 0, -1) if ok(v)), None)
    above = next((v for v in range(value + 1, value + limit + 1) if ok(v)), None)
    return below, above


def describe_nearest(name: str, value: int, ok: Callable[[int], bool]) -> str:
    below, above = nearest_valid(value, ok)
    options = [str(v) for v in (below, above) if v is not None]
    if not options:
        return ""
    return f"; nearest valid {name}: {' or '.join(options)} (instead of {value})"


def unfit_hint(
    problem: Callable[[int, int, int, int, int], str],
    rec: RecommendationInput,
    dp: int,
    mini_batches: int,
    micro_name: str,
    per_gpu: int,
    batch_name: str,
) -> str:
    """How to make an unexpressible winner fit: the micro-batch alone when that suffices, else the
    nearest number of prompts. ``problem(P, G, mini_batches, dp, micro)`` is the trainer's rule."""
    P, G, micro = rec.prompts, rec.group_size, rec.micro_batch_per_gpu
    if not problem(P, G, mini_batches, dp, 0):
        return micro_hint(micro_name, per_gpu, micro)
    return describe_nearest(batch_name, P, lambda p: not problem(p, G, mini_batches, dp, micro))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def micro_hint(name: str, per_gpu: int, micro: int) -> str:
    """Suggest the largest micro-batch at most ``micro`` that divides the per-GPU batch."""
    ok = [d for d in divisors(per_gpu) if d <= micro] if per_gpu > 0 else []
    return f"; use {name}={ok[-1]} (it must divide {per_gpu})" if ok else ""
