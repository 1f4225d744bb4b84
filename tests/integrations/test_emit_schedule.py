"""A batch schedule emitted as one trainer config per stage (integrations/emit_schedule.py)."""

from __future__ import annotations

import numpy as np
import pytest

from batchtune.analysis.schedule import ScheduleCandidate, compare_schedule
from batchtune.integrations.emit_base import RecommendationInput
from batchtune.integrations.emit_schedule import emit_schedule

LADDER = [8, 16, 32, 64, 128, 256, 512]


@pytest.mark.parametrize("trainer", ["verl", "trl", "openrlhf"])
def test_one_config_per_stage_with_the_resume_note(trainer):
    cands = [
        ScheduleCandidate(f"P{n // 8}xG8", n // 8, 8, 1e-6 * (n / 8) ** 0.5, n / (1 + 0.01 * n))
        for n in LADDER
    ]
    cmp = compare_schedule(
        lambda p: 16.0 * np.asarray(p) / 1000.0, cands, reference="P1xG8", end_progress=80000.0, tol=0.1
    )
    text = emit_schedule(trainer, cmp, RecommendationInput(8, 8, 1e-6), num_gpus=8)
    n = len(cmp.stages)
    assert n > 2 and text.count("# ---- stage") == n and text.count("# resume:") == n - 1
    last = cmp.stages[-1]
    assert f"{last.prompts} x {last.group_size}" in text and f"{last.lr:.3g}" in text
