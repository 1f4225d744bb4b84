"""A batch schedule emitted as one trainer config per stage (integrations/emit_schedule.py)."""

from __future__ import annotations

import pytest

from batchtune.analysis.schedule import ScheduleCandidate, Segment, compare_schedule
from batchtune.integrations.emit_base import RecommendationInput
from batchtune.integrations.emit_schedule import emit_schedule

LADDER = [8, 16, 32, 64, 128, 256, 512]


@pytest.mark.parametrize("trainer", ["verl", "trl", "openrlhf"])
def test_one_config_per_stage_with_the_resume_note(trainer):
    cands = [
        ScheduleCandidate(f"P{n // 8}xG8", n // 8, 8, 1e-6 * (n / 8) ** 0.5, n / (1 + 0.01 * n))
        for n in LADDER
    ]
    segs = [  # a growing local critical batch: McCandlish ratios (B_noise + B) / (B_noise + 8)
        Segment(20000.0, {float(n): (b + n) / (b + 8.0) for n in LADDER}, b)
        for b in (8.0, 60.0, 400.0, 3000.0)
    ]
    cmp = compare_schedule(segs, cands, reference="P1xG8", tol=0.1)
    text = emit_schedule(trainer, cmp, RecommendationInput(8, 8, 1e-6), num_gpus=8)
    n = len(cmp.stages)
    assert n > 2 and text.count("# ---- stage") == n and text.count("# resume:") == n - 1
    last = cmp.stages[-1]
    assert f"{last.prompts} x {last.group_size}" in text and f"{last.lr:.3g}" in text
