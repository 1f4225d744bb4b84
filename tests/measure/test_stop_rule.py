"""The stop rule as a pure function: each way a run ends, from the steps it has shown."""

from __future__ import annotations

import math

from batchtune.measure.stop_rule import RunCurve, StopPolicy, stop_reason
from batchtune.records.types import StepRecord

POLICY = StopPolicy("reward", 0.5, True, 0.0, max_samples=1000, stop_at_target=True, band_samples=math.inf)


def _step(i: int, reward: float, samples_per_step: int = 10, **kw: float) -> StepRecord:
    return StepRecord("r", i, i * samples_per_step, 0, 1e-3, 1, 10, 0, metrics={"reward": reward}, **kw)


def _run(policy: StopPolicy, rewards: list[float], **kw: float) -> tuple[int, tuple[str, str] | None]:
    """Feed the steps until the rule stops the run: (steps taken, verdict)."""
    curve = RunCurve()
    for i, r in enumerate(rewards, 1):
        step = _step(i, r, **kw)
        curve.add(step, policy)
        verdict = stop_reason(policy, curve, step, "responses")
        if verdict is not None:
            return i, verdict
    return len(rewards), None


def test_a_confirmed_crossing_stops_the_run_past_it():
    n, verdict = _run(POLICY, [0.1 * i for i in range(1, 20)])
    assert verdict is not None and verdict[0] == "reached_target"
    assert 5 < n < 19  # after the raw crossing at step 5, once 25% past it is seen


def test_no_target_stop_when_the_recipe_says_so():
    policy = StopPolicy("reward", 0.5, True, 0.0, 1000, stop_at_target=False, band_samples=math.inf)
    assert _run(policy, [0.1 * i for i in range(1, 20)]) == (19, None)


def test_the_band_stops_a_run_past_both_samples_and_seconds():
    banded = StopPolicy("reward", 0.5, True, 0.0, 1000, True, band_samples=50, band_time_s=8.0)
    # 1 s a step: past 50 samples at step 5, past 8 s at step 8
    n, verdict = _run(banded, [0.0] * 20, train_s=1.0)
    assert n == 8 and verdict is not None and verdict[0] == "stopped_outside_band"
    assert "(50)" in verdict[1]


def test_the_budget_and_a_non_finite_value_end_a_run():
    assert _run(POLICY, [0.0] * 200)[1] == ("budget_exhausted", "spent the budget of 1000 responses")
    n, verdict = _run(POLICY, [0.0, 0.1, math.nan, 0.2])
    assert n == 3 and verdict == ("diverged", "reward not finite at step 3")
    n, verdict = _run(POLICY, [0.0, 0.1], grad_norm=math.inf)
    assert n == 1 and verdict == ("diverged", "grad_norm not finite at step 1")


def test_a_branched_run_counts_samples_from_its_origin():
    policy = StopPolicy("reward", 0.5, True, 0.0, 10_000, True, math.inf, origin_samples=30)
    curve = RunCurve()
    for i in range(1, 4):
        curve.add(_step(i, 0.0), policy)
    assert curve.samples == [-20, -10, 0] and not curve.reached
