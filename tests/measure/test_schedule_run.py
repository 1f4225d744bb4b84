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


@pytest.mark.slow  # three real GRPO runs to a reward of 0.86: ~30 s on 2 cores
def test_the_grpo_trainer_runs_a_schedule_and_a_chain_of_one_batch_is_the_fixed_run(tmp_path):
    """The built-in GRPO trainer checkpoints between stages; its held-out metric is logged only at
    evaluations, and the chain of one batch must still read the same crossing as the fixed run."""
    grpo = load_recipe(
        "recipes/tiny-grpo.toml",
        [f"run.results_dir={tmp_path}/r", "target.value=0.86", "budget.max_samples=4096"]
        + ["task.eval_every_samples=128"],
    )
    by = plan_candidates(grpo).by_label()
    ref = plan_candidates(grpo).reference_batch
    fixed = run_schedule(grpo, tmp_path / "a", [(by["P4xG8"], 0)], 1, reference_batch=ref, tag="fixed")
    chain = run_schedule(
        grpo, tmp_path / "b", [(by["P4xG8"], 256), (by["P4xG8"], 0)], 1, reference_batch=ref, tag="chain"
    )
    assert fixed.samples_to_target is not None and fixed.samples_to_target > 0
    assert chain.samples_to_target == pytest.approx(fixed.samples_to_target)
    assert chain.steps_to_target == pytest.approx(fixed.steps_to_target)
    warm = run_schedule(
        grpo, tmp_path / "c", [(by["P2xG8"], 256), (by["P8xG8"], 0)], 1, reference_batch=ref, tag="warm"
    )
    assert chain.stages == ("P4xG8", "P4xG8") and fixed.samples_to_target > 256  # the chain resumed
    assert warm.stages == ("P2xG8", "P8xG8")
    if warm.samples_to_target is not None:  # 256 samples at 16 per step, then 64 per step
        assert warm.steps_to_target == pytest.approx(16 + (warm.samples_to_target - 256) / 64, abs=1.0)
