"""Running a batch schedule as a chain of resumed stages (measure/schedule_run.py) on the NQM."""

from __future__ import annotations

import pytest

from batchtune.measure.plan import plan_candidates
from batchtune.measure.schedule_run import run_schedule
from batchtune.recipe.load import load_recipe


@pytest.fixture
def nqm(tmp_path):
    return load_recipe("recipes/nqm.toml", [f"run.results_dir={tmp_path}/r", "budget.max_samples=20000"])


def test_two_stages_of_one_batch_are_the_fixed_run(nqm, tmp_path):
    by = plan_candidates(nqm).by_label()
    ref = plan_candidates(nqm).reference_batch
    fixed = run_schedule(nqm, tmp_path / "a", [(by["P32xG8"], 0)], 3, reference_batch=ref, tag="fixed")
    chain = run_schedule(
        nqm, tmp_path / "b", [(by["P32xG8"], 4096), (by["P32xG8"], 0)], 3, reference_batch=ref, tag="chain"
    )
    assert fixed.samples_to_target is not None
    assert chain.samples_to_target == pytest.approx(fixed.samples_to_target)
    assert chain.steps_to_target == pytest.approx(fixed.steps_to_target)
    assert chain.time_to_target_s == pytest.approx(fixed.time_to_target_s)


def test_a_warmup_switches_batch_and_resumes_without_rerunning(nqm, tmp_path):
    by = plan_candidates(nqm).by_label()
    ref = plan_candidates(nqm).reference_batch
    stages = [(by["P8xG8"], 1024), (by["P32xG8"], 0)]
    first = run_schedule(nqm, tmp_path / "w", stages, 5, reference_batch=ref, tag="warm")
    again = run_schedule(nqm, tmp_path / "w", stages, 5, reference_batch=ref, tag="warm")
    assert first == again and first.stages == ("P8xG8", "P32xG8")
    assert first.samples_to_target is not None and first.samples_to_target > 1024
    # 1024 samples at 64 per step, then 256 per step
    assert first.steps_to_target == pytest.approx(16 + (first.samples_to_target - 1024) / 256, abs=1.0)
