"""A batch schedule in a trainer's own units: one config per stage, each resumed from the last.

None of verl, TRL or OpenRLHF changes the rollout batch inside one run, so a schedule is a chain of
runs: stage i trains until the schedule's cumulative samples reach its end, saves a checkpoint, and
stage i+1 starts from it with its own batch and LR (the LR of every stage is already the recipe's
rule at that batch; docs/method.md §6: a schedule must state the LR at every stage). How each trainer
resumes (check against the version you run):
- verl: ``trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N dir>``; the step
  counter is restored, so ``trainer.total_training_steps`` is cumulative.
- TRL: ``trainer.train(resume_from_checkpoint=<checkpoint-N dir>)``; max_steps is cumulative, and
  the Trainer skips ``global_step x batch`` of data on resume, which is wrong once the batch changed:
  set ``ignore_data_skip=True`` and start the dataset at the samples already consumed.
- OpenRLHF: ``--load_checkpoint --ckpt_path <dir>``; it restores consumed_samples from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from batchtune.analysis.recommend import Recommendation
from batchtune.analysis.schedule import ScheduleComparison
from batchtune.errors import InputError
from batchtune.integrations.emit import emit, recommendation_input
from batchtune.integrations.emit_base import RecommendationInput
from batchtune.recipe.schema import Recipe

RESUME = {
    "verl": (
        "trainer.resume_mode=resume_path trainer.resume_from_path=<stage {prev}: global_step_{steps}>"
        " trainer.total_training_steps={total}"
    ),
    "trl": (
        "trainer.train(resume_from_checkpoint=<stage {prev}: checkpoint-{steps}>) with max_steps={total},"
        " ignore_data_skip=True and the dataset started {samples:,} samples in"
    ),
    "openrlhf": "--load_checkpoint --ckpt_path <stage {prev} checkpoint> (consumed_samples: {samples:,})",
}


def emit_schedule(
    trainer: str, schedule: ScheduleComparison, base: RecommendationInput, num_gpus: int, **options: Any
) -> str:
    """The stage table and one config per stage (``base`` with the stage's P, G and LR), as text."""
    lines = [
        f"# batch schedule ({schedule.verdict()})",
        "# stage | from samples | to samples | batch (P x G) | lr | steps",
    ]
    blocks: list[str] = []
    total_steps = 0
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
            head += "\n# resume: " + RESUME[trainer].format(
                prev=i, steps=total_steps, total=total_steps + steps, samples=round(st.start_samples)
            )
        total_steps += steps
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
