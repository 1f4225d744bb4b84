"""The contracts between the measuring drivers (probe.py, profile.py) and the backends.

A training backend turns a RunSpec into a stream of StepRecords; a generation backend answers timed
generation requests. Backends are plain classes that satisfy these protocols; they share helper
functions, not base classes. Heavy engines (torch, vllm, trl) are imported inside the backend modules.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from batchtune.recipe.schema import Recipe
from batchtune.records.types import ModelInfo, StepRecord


@dataclass(frozen=True)
class Candidate:
    """One training configuration of the sweep: P prompts x G responses at a given LR."""

    label: str  # e.g. "P16xG8", "P16xG8-fixedlr"
    prompts: int
    group_size: int
    lr: float  # actor LR after the scaling rule (peak, before warmup)
    lr_rule: str
    critic_lr: float | None = None  # PPO critic LR after its own scaling rule
    fixed_lr: bool = False  # a fixed-LR control
    # off-policy (docs/trainer.md): rollouts generated with the weights of `staleness` trainer steps
    # ago, importance-corrected against the behaviour policy's log-probs; `updates_per_batch`
    # optimiser updates per rollout batch (algorithm.mini_batches x epochs; 0 = the recipe's
    # mini_batches, one epoch). 0 and 0 train exactly as the on-policy trainer does.
    staleness: int = 0
    updates_per_batch: int = 0

    @property
    def batch_responses(self) -> int:
        return self.prompts * self.group_size


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    candidate: Candidate
    seed: int
    recipe: Recipe
    run_dir: Path  # a folder the backend may use for its own files (logs, checkpoints)
    base_lr: float
    reference_batch: int  # total responses base_lr belongs to
    # branched probes (measure/branched.py): start from a checkpoint a trunk saved, and/or save one
    # at each of these cumulative sample counts into checkpoint_dir/ckpt-<samples>. A backend that
    # cannot checkpoint says so with supports_checkpoints = False (RunFailed "failed" if asked).
    resume_from: Path | None = None
    save_at_samples: tuple[int, ...] = ()
    checkpoint_dir: Path | None = None

    def step_record(
        self, step: int, samples: int, tokens: int, lr: float, metrics: dict[str, float], **reported: Any
    ) -> StepRecord:
        """The record of this run's optimiser step ``step``: the run's id, P, G and seed, with what
        the backend measured (``reported``: gradient norms, seconds)."""
        c = self.candidate
        return StepRecord(
            self.run_id, step, samples, tokens, lr, c.prompts, c.group_size, self.seed, metrics, **reported
        )


def branch_seed(seed: int, position: int) -> int:
    """The RNG seed of a branch at ``seed`` started from a checkpoint at ``position`` (samples or
    tokens) when it is not the trunk's own seed: independent of the trunk's stream and of other
    checkpoints, the same for every batch at that seed (paired comparisons). 63 bits."""
    import numpy as np

    return int(np.random.SeedSequence([seed, position, 0x62726E63]).generate_state(2, np.uint64)[0] >> 1)


def checkpoint_path(checkpoint_dir: Path, samples: int) -> Path:
    """Where the checkpoint taken after ``samples`` cumulative samples lives."""
    return checkpoint_dir / f"ckpt-{samples}"


class RunFailed(Exception):
    """Raised by a backend when a run cannot go on; ``status`` is a records.RUN_STATUSES value."""

    def __init__(self, status: str, message: str, *, started: bool = True):
        super().__init__(message)
        self.status = status
        self.message = message
        # False only where the backend knows no training step ran: a user's trainer command that
        # exited before its log held a step (not installed, refused its config). Such a run measured
        # nothing, and a rerun of the probe runs it again (records.failed_before_training).
        self.started = started


class OutOfMemory(RunFailed):
    def __init__(self, message: str):
        super().__init__("oom", message)


class TrainingBackend(Protocol):
    name: str

    def train(self, spec: RunSpec) -> Iterator[StepRecord]:
        """Yield one StepRecord per optimiser step until the sample budget is spent.

        The caller may stop early by closing the generator (target reached, outside the band).
        Raise RunFailed (or OutOfMemory) when the run cannot continue.
        """
        ...


@dataclass(frozen=True)
class GenRequest:
    concurrency: int  # responses decoded at once = prompts x group_size
    group_size: int  # responses per prompt (vLLM: SamplingParams(n=G))
    prompt_tokens: int
    max_new_tokens: int
    mode: str  # fixed: EOS ignored, every response max_new_tokens long | eos: real stopping
    seed: int = 0


@dataclass(frozen=True)
class GenResult:
    responses: int
    output_tokens: int
    elapsed_s: float
    peak_mem_bytes: int = 0
    preemptions: int = 0
    queued: int = 0  # vLLM: most requests left waiting while its KV cache was full (gen_vllm)


class GenerationBackend(Protocol):
    name: str

    def model_info(self) -> ModelInfo: ...

    def generate(self, request: GenRequest) -> GenResult:
        """Run one timed generation batch; raise OutOfMemory if it does not fit."""
        ...

    def train_step_s(self, batch_responses: int, seq_tokens: int) -> float:
        """Seconds for one optimiser step (forward, backward, step) on this batch; OutOfMemory if not."""
        ...

    def close(self) -> None: ...
