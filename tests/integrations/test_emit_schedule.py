"""A batch schedule emitted as one trainer config per stage (integrations/emit_schedule.py)."""

from __future__ import annotations

import math

import pytest

from batchtune.analysis.branched.schedule import ScheduleCandidate, Segment, compare_schedule
from batchtune.integrations.emit_base import RecommendationInput
from batchtune.integrations.emit_schedule import emit_schedule

LADDER = [8, 16, 32, 64, 128, 256, 512]


def _schedule():
    cands = [
        ScheduleCandidate(f"P{n // 8}xG8", n // 8, 8, 1e-6 * (n / 8) ** 0.5, n / (1 + 0.01 * n))
        for n in LADDER
    ]
    segs = [  # a growing local critical batch: McCandlish ratios (B_noise + B) / (B_noise + 8)
        Segment(20000.0, {float(n): (b + n) / (b + 8.0) for n in LADDER}, b)
        for b in (8.0, 60.0, 400.0, 3000.0)
    ]
    return compare_schedule(segs, cands, reference="P1xG8", tol=0.1)


@pytest.mark.parametrize("trainer", ["verl", "trl", "openrlhf"])
def test_one_config_per_stage_with_the_resume_note(trainer):
    cmp = _schedule()
    text = emit_schedule(trainer, cmp, RecommendationInput(8, 8, 1e-6), num_gpus=8)
    n = len(cmp.stages)
    assert n > 2 and text.count("# ---- stage") == n and text.count("# resume:") == n - 1
    last = cmp.stages[-1]
    assert f"{last.prompts} x {last.group_size}" in text and f"{last.lr:.3g}" in text


def _resumes(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("# resume:")]


def test_resume_notes_keep_the_previous_stages_lr_out_or_say_they_cannot():
    """A checkpoint restores the LR scheduler with the optimiser (verl's 'extra' content, TRL's
    scheduler.pt, OpenRLHF's DeepSpeed state): each stage's LR only applies where the note says how
    to leave it out, and OpenRLHF's flags are its 0.10.2+ names (the flat ones only when asked)."""
    cmp = _schedule()
    ppo = RecommendationInput(8, 8, 1e-6, algorithm="ppo", critic_lr=1e-5)
    verl = _resumes(emit_schedule("verl", cmp, ppo, num_gpus=8))
    assert verl and all(
        "actor_rollout_ref.actor.checkpoint.load_contents=['model','optimizer']" in r
        and "critic.checkpoint.load_contents=['model','optimizer']" in r
        for r in verl
    )
    trl = _resumes(emit_schedule("trl", cmp, RecommendationInput(8, 8, 1e-6), num_gpus=8))
    assert trl and all("delete the checkpoint's scheduler.pt" in r for r in trl)
    rlhf = _resumes(emit_schedule("openrlhf", cmp, RecommendationInput(8, 8, 1e-6), num_gpus=8))
    assert rlhf and all("--ckpt.load_enable --ckpt.path" in r and "--load_checkpoint" not in r for r in rlhf)
    assert all("runs at stage" in r and "total_consumed_prompts" in r for r in rlhf)
    legacy = emit_schedule("openrlhf", cmp, RecommendationInput(8, 8, 1e-6), num_gpus=8, legacy_flags=True)
    assert all("--load_checkpoint --ckpt_path" in r for r in _resumes(legacy))


def test_the_data_offset_of_a_resumed_stage_counts_the_whole_steps_trained():
    """Stages end on whole optimiser steps, past the schedule's boundary: the data already consumed
    is the steps trained times their batch, not the boundary."""
    cmp = _schedule()
    trl = _resumes(emit_schedule("trl", cmp, RecommendationInput(8, 8, 1e-6), num_gpus=8))
    first = cmp.stages[0]
    steps = max(1, math.ceil(first.steps))
    assert f"started {steps * first.prompts * first.group_size:,} samples in" in trl[0]


def test_openrlhf_counts_the_prompts_of_each_stage_at_its_own_group_size():
    """total_consumed_prompts was every stage's samples over the winner's G: wrong once G changes."""
    cands = [
        ScheduleCandidate(f"P{n // g}xG{g}", n // g, g, 1e-6 * (n / 8) ** 0.5, n / (1 + 0.01 * n))
        for n in LADDER
        for g in [8 if n < 128 else 16]
    ]
    segs = [
        Segment(20000.0, {float(n): (b + n) / (b + 8.0) for n in LADDER}, b)
        for b in (8.0, 60.0, 400.0, 3000.0)
    ]
    cmp = compare_schedule(segs, cands, reference="P1xG8", tol=0.1)
    assert len({st.group_size for st in cmp.stages}) == 2, cmp.stages
    notes = _resumes(emit_schedule("openrlhf", cmp, RecommendationInput(8, 16, 1e-6), num_gpus=8))
    prompts = 0
    for st, note in zip(cmp.stages, notes, strict=False):
        prompts += max(1, math.ceil(st.steps)) * st.prompts
        assert f"total_consumed_prompts, here {prompts:,}," in note
