"""A batch schedule in a trainer's own units: one config per stage, each resumed from the last.

None of verl, TRL or OpenRLHF changes the rollout batch inside one run, so a schedule is a chain of
runs: stage i trains until the schedule's cumulative samples reach its end, saves a checkpoint, and
stage i+1 starts from it with its own batch and LR (the LR of every stage is already the recipe's
rule at that batch; docs/method.md §6: a schedule must state the LR at every stage). How each trainer
resumes, and what its checkpoint brings back besides the weights (checked against verl b178a3cd,
trl 1.16 with transformers 5.24, OpenRLHF v0.11.0; check against the version you run):
- verl: ``trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N dir>``; the step
  counter is restored, so ``trainer.total_training_steps`` is cumulative. The checkpoint's "extra"
  content holds the LR scheduler, whose base LR is the previous stage's: load only
  ``['model','optimizer']`` (``actor_rollout_ref.actor.checkpoint.load_contents``, and the critic's)
  so the new LR takes over (the optimiser state still carries the old LR into the first update).
- TRL: ``trainer.train(resume_from_checkpoint=<checkpoint-N dir>)``; max_steps is cumulative, and
  the Trainer skips ``global_step x batch`` of data on resume, which is wrong once the batch changed:
  set ``ignore_data_skip=True`` and start the dataset at the samples already consumed. Its
  ``scheduler.pt`` restores the previous LR: delete it, and the Trainer skips ``optimizer.pt`` too
  (Adam's moments start afresh; a DeepSpeed run fails without the file and keeps the old LR).
- OpenRLHF: ``--ckpt.load_enable --ckpt.path <dir>`` (``--load_checkpoint --ckpt_path`` before
  0.10.2); it restores ``total_consumed_prompts`` and, through DeepSpeed, the LR scheduler: the stage
  keeps the previous stage's LR, and OpenRLHF has no flag to skip it. It has no step limit either:
  stop each stage at its checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from batchtune.analysis.branched.schedule import ScheduleComparison
from batchtune.analysis.decide.recommend import Recommendation
from batchtune.errors import InputError
from batchtune.integrations.emit import emit, recommendation_input
from batchtune.integrations.emit_base import RecommendationInput
from batchtune.recipe.schema import Recipe


def resume_note(
    trainer: str,
    prev: int,
    steps: int,
    total: int,
    consumed: tuple[int, int],
    base: RecommendationInput,
    **options: Any,
) -> str:
    """How stage ``prev + 1`` resumes from stage ``prev``'s checkpoint (module docstring): ``steps``
    the optimiser steps before it, ``total`` those at its end, ``consumed`` the (samples, prompts)
    trained on, in whole steps."""
    samples, prompts = consumed
    if trainer == "verl":
        roles = ["actor_rollout_ref.actor", *(["critic"] if base.algorithm == "ppo" else [])]
        contents = " ".join(f"{r}.checkpoint.load_contents=['model','optimizer']" for r in roles)
        return (
            f"trainer.resume_mode=resume_path trainer.resume_from_path=<stage {prev}: global_step_{steps}>"
            f" trainer.total_training_steps={total} {contents}"
            f"  (not 'extra': it holds stage {prev}'s LR scheduler)"
        )
    if trainer == "trl":
        return (
            f"trainer.train(resume_from_checkpoint=<stage {prev}: checkpoint-{steps}>) with"
            f" max_steps={total}, ignore_data_skip=True and the dataset started {samples:,} samples in;"
            f" delete the checkpoint's scheduler.pt first, or it restores stage {prev}'s LR (the Trainer"
            " then starts Adam's moments afresh: it loads optimizer.pt only beside scheduler.pt; under"
            " DeepSpeed a missing scheduler.pt fails, so there keep it and the old LR)"
        )
    load = (
        "--load_checkpoint --ckpt_path" if options.get("legacy_flags") else "--ckpt.load_enable --ckpt.path"
    )
    return (
        f"{load} <stage {prev} checkpoint dir> (it restores total_consumed_prompts, here {prompts:,},"
        f" and stage {prev}'s LR scheduler through DeepSpeed: OpenRLHF has no flag to skip it, so this"
        f" stage runs at stage {prev}'s LR); stop the stage at its step {total} checkpoint (no step limit)"
    )


def emit_schedule(
    trainer: str, schedule: ScheduleComparison, base: RecommendationInput, num_gpus: int, **options: Any
) -> str:
    """The stage table and one config per stage (``base`` with the stage's P, G and LR), as text."""
    lines = [
        f"# batch schedule ({schedule.verdict()})",
        "# stage | from samples | to samples | batch (P x G) | lr | steps",
    ]
    blocks: list[str] = []
    total_steps = samples = prompts = 0
    for i, st in enumerate(schedule.stages):
        steps = max(1, math.ceil(st.steps))
        lines.append(
            f"# {i + 1} | {st.start_samples:,.0f} | {st.end_samples:,.0f} | {st.prompts} x {st.group_size} "
            f"| {st.lr:.3g} | {steps:,}"
        )
        spec = dataclasses.replace(base, prompts=st.prompts, group_size=st.group_size, lr=st.lr)
        text = emit(trainer, spec, num_gpus, **options).text
        head = f"# ---- stage {i + 1}: {st.label} until {st.end_samples:,.0f} samples ({steps:,} steps)"
        if i:
            done = (samples, prompts)
            note = resume_note(trainer, i, total_steps, total_steps + steps, done, base, **options)
            head += "\n# resume: " + note
        total_steps += steps
        samples += steps * st.prompts * st.group_size  # whole steps: past the stage's end
        prompts += steps * st.prompts
        blocks.append(f"{head}\n{text.rstrip()}")
    return "\n".join(lines) + "\n" + "\n".join(blocks) + "\n"


def schedule_appendix(
    trainer: str, rec: Recommendation, cfg: Recipe | None, num_gpus: int, **options: Any
) -> str:
    """What `--emit` appends for a recommendation with a schedule of >= 2 stages ("" otherwise); a
    stage the trainer cannot run on ``num_gpus`` turns the appendix into that message."""
    if rec.schedule is None or len(rec.schedule.stages) < 2:
        return ""
    try:
        return "\n" + emit_schedule(
            trainer, rec.schedule, recommendation_input(rec, cfg), num_gpus, **options
        )
    except InputError as exc:
        return f"\n# batch schedule not emitted: {exc}\n"
