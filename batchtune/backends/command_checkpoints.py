"""Checkpoints of a command run: where a run starts, the trainer's own step at a sample count, and a
resumed run's logged steps put on the cumulative samples axis (the module docstring of
``backends/command.py`` says how the recipe asks a trainer to save and resume)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from batchtune.backends.spec import RunFailed, RunSpec
from batchtune.records.types import StepRecord

CHECKPOINT_META = "batchtune-checkpoint.json"  # in <checkpoint_dir>/ckpt-<samples>/: where it lies


@dataclass(frozen=True)
class Origin:
    """Where a run starts: from scratch, or a checkpoint taken after ``samples`` cumulative samples
    at the trainer's own step ``step``, lying at ``path``."""

    samples: int = 0
    step: int = 0
    path: str = ""
    lr: float = 0.0  # the LR of the run that saved it (0: not recorded)

    def base_step(self, mode: str) -> int:
        """The trainer's step count from which this run's steps count: the checkpoint's when the
        trainer goes on counting (``resume_steps = "continue"``), 0 when it restarts."""
        return self.step if mode == "continue" else 0


def origin(spec: RunSpec) -> Origin:
    """The run's start: its checkpoint's record (``CHECKPOINT_META``), or from scratch."""
    if spec.resume_from is None:
        return Origin()
    meta = Path(spec.resume_from) / CHECKPOINT_META
    try:
        d = json.loads(meta.read_text())
        return Origin(int(d["samples"]), int(d["step"]), str(d["path"]), float(d.get("lr", 0.0)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunFailed("failed", f"cannot read the checkpoint record {meta}: {exc}") from None


def check_resumed_lr(logged: list[float], lr: float, start: Origin) -> None:
    """Fail a resumed run whose trainer logs the LR of the run that saved the checkpoint at every
    step instead of its own: its checkpoint restored the LR scheduler (verl's 'extra' content, TRL's
    scheduler.pt, OpenRLHF's DeepSpeed state), so a branch at 2x the batch trains at the trunk's LR
    and its ratio measures the wrong thing. Only an LR the log states counts (else the run's own is
    recorded); a fresh warmup passes the trunk's LR on one step, not on all of them."""
    if start.lr <= 0 or abs(lr - start.lr) <= 0.01 * lr:
        return
    if not logged or any(abs(x - start.lr) > 1e-4 * start.lr for x in logged):
        return
    last = logged[-1]
    raise RunFailed(
        "failed",
        f"the trainer logs lr {last:.4g} after resuming, the checkpoint's, not this run's {lr:.4g}: "
        "the checkpoint restored its LR scheduler; resume the model and optimiser only "
        "(backend.command_resume_args; docs/branched.md, 'Your own trainer')",
    )


def trainer_step(start: Origin, samples: int, batch: int, mode: str) -> int | None:
    """The trainer's own step count after ``samples`` cumulative samples (None: not a whole step)."""
    k, rem = divmod(samples - start.samples, batch)
    if rem:
        return None
    return start.base_step(mode) + k


def on_samples_axis(steps: list[StepRecord], spec: RunSpec, start: Origin, partial: bool) -> list[StepRecord]:
    """A resumed run's logged steps on the cumulative samples axis, counted from its checkpoint
    (``steps`` unchanged for a run from scratch); ``partial``: the run is still going."""
    if spec.resume_from is None:
        return steps
    first = start.base_step(spec.recipe.backend.resume_steps)
    n = spec.candidate.batch_responses
    out = []
    for s in steps:
        k = s.step - first  # optimiser steps since the checkpoint
        if k <= 0:
            continue  # a trainer that logs its state at the resume point: the trunk's record
        out.append(dataclasses.replace(s, step=start.step + k, samples=start.samples + k * n))
    if out and (len(out) > 1 or not partial):
        check_resumed_lr([s.lr for s in out], spec.candidate.lr, start)
    return out
