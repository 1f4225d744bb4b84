"""From run records to sample efficiency, on synthetic runs with known samples-to-target."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from batchtune.analysis.sample.assess import analyse_runs
from batchtune.analysis.sample.efficiency import RunData
from batchtune.errors import MetricMissingError, RunsFailed
from batchtune.records.types import RunRecord, StepRecord

TRUE_R = {2: 1000.0, 4: 1020.0, 16: 3000.0}  # prompts -> responses to reach 0.5 (G = 8)


def _run(p: int, seed: int, rng, status: str = "completed", critic: bool = False) -> RunData:
    n = p * 8
    r = TRUE_R[p] * rng.uniform(0.98, 1.02)
    steps = []
    for k in range(int(2.5 * TRUE_R[p] / n) + 2):
        s = k * n
        g = (1.0 / np.sqrt(n)) * rng.uniform(0.95, 1.05) + 0.001
        steps.append(
            StepRecord(f"P{p}xG8-s{seed}", k, s, s * 4, 1e-3, p, 8, seed,
                       metrics={"reward": 0.5 * s / r}, grad_norm=g,
                       critic_grad_norm=0.3 * rng.uniform(0.95, 1.05) if critic else None)
        )  # fmt: skip
    rec = RunRecord(f"P{p}xG8-s{seed}", f"P{p}xG8", p, 8, seed, 1e-3, "sqrt", 1e-3, 16, status,
                    samples=steps[-1].samples)  # fmt: skip
    return RunData(rec, tuple(steps))


def _runs(critic: bool = False, fail: bool = False):
    rng = np.random.default_rng(0)
    runs = [_run(p, s, rng, critic=critic) for p in TRUE_R for s in range(3)]
    if fail:
        runs.append(_run(16, 3, rng, status="diverged"))
    return runs


def test_estimates_verdicts_and_critical_batch():
    eff = analyse_runs(_runs(fail=True), metric="reward", target=0.5)
    by = {c.label: c for c in eff.candidates}
    assert by["P2xG8"].estimate.samples_to_target == pytest.approx(1000, rel=0.05)
    assert by["P4xG8"].status == "invariant" and by["P16xG8"].status == "deviates"
    assert eff.critical.batch == 32
    assert by["P16xG8"].failures == ("seed 3: diverged",)
    est = by["P16xG8"].estimate  # the diverged seed is reported, and censored in R (not dropped)
    assert (est.n_seeds, est.n_censored, est.per_seed[3], est.ci_high) == (4, 1, None, np.inf)
    assert eff.grad_slope.slope == pytest.approx(-0.5, abs=0.1)


def test_a_diverged_seed_counts_as_never_reaching_not_as_absent():
    # two of three seeds diverged after their curves crossed: the typical run never reached the
    # target, though the survivor did; dropping them would read the survivor's R (the old rule)
    rng = np.random.default_rng(1)
    runs = [_run(p, s, rng) for p in (2, 4) for s in range(3)]
    runs += [_run(16, 0, rng)] + [_run(16, s, rng, status="diverged") for s in (1, 2)]
    by = {c.label: c for c in analyse_runs(runs, metric="reward", target=0.5).candidates}
    assert by["P16xG8"].estimate.samples_to_target == np.inf and by["P16xG8"].estimate.n_censored == 2
    assert len(by["P16xG8"].failures) == 2


def test_only_oom_and_crashes_are_left_out_of_r():
    rng = np.random.default_rng(2)
    runs = [_run(p, s, rng) for p in (2, 4) for s in range(3)] + [_run(4, 3, rng, status="oom")]
    assert {c.label: c for c in analyse_runs(runs, metric="reward", target=0.5).candidates}[
        "P4xG8"
    ].estimate.n_seeds == 3


def test_critic_slope_is_judged_on_its_own():
    eff = analyse_runs(_runs(critic=True), metric="reward", target=0.5)
    assert eff.critic_grad_slope is not None
    assert abs(eff.critic_grad_slope.slope) < 0.15 and not eff.critic_grad_slope.noise_dominated


def test_every_run_failed_says_so_with_the_runs_reasons():
    rng = np.random.default_rng(0)
    runs = [_run(p, 0, rng, status="diverged") for p in TRUE_R]
    runs = [
        dataclasses.replace(r, record=dataclasses.replace(r.record, reason="loss nan at step 3"))
        for r in runs
    ]
    runs.append(_run(2, 1, rng, status="timeout"))
    with pytest.raises(
        RunsFailed, match=r"every run failed.*4 run\(s\) failed \(3 diverged, 1 timeout\)"
    ) as err:
        analyse_runs(runs, metric="reward", target=0.5)
    assert "loss nan at step 3" in str(err.value) and "target metric" not in str(err.value)


def test_unknown_metric_names_the_ones_logged():
    with pytest.raises(MetricMissingError, match="runs have: reward"):  # bad input: exit 2
        analyse_runs(_runs(), metric="eval_reward", target=0.5)


def test_never_reached_is_censored_not_dropped():
    eff = analyse_runs(_runs(), metric="reward", target=10.0)
    ref = eff.get("P2xG8")
    assert ref.estimate.n_censored == 3 and ref.estimate.samples_to_target == float("inf")
    assert any("never reached" in n for n in eff.notes)
