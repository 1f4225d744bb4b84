"""The NQM with stale gradients and reuse (batchtune/backends/nqm_async.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchtune.backends.nqm_async import (
    expected_async_losses,
    expected_async_samples_to_target,
    expected_async_step_samples_to_target,
    probe_half_width,
    read_crossing,
    read_isotonic_crossing,
    simulate_samples_to_target,
)
from batchtune.backends.nqm_theory import expected_sgd_losses
from batchtune.errors import AnalysisError
from batchtune.recipe.schema import NQMConfig

CFG = NQMConfig(dim=16)


def test_on_policy_is_the_existing_closed_form() -> None:
    got = expected_async_losses(CFG, lr=0.5, batch=32, delay=0, updates_per_batch=1, n_updates=100)
    want = expected_sgd_losses(CFG, np.full(100, 0.5), 32)
    assert np.allclose(got, want, rtol=1e-12)


def test_by_hand_one_coordinate() -> None:
    cfg = NQMConfig(dim=1, noise_scale=1.0)  # h = 1, theta0 = 1, Var eps = 1 / B
    # delay 1: theta1 = theta0 - a (theta_{-1} + e) = 1 - a - a e; theta2 = theta1 - a (theta0 + e)
    a, b = 0.5, 4
    got = expected_async_losses(cfg, lr=a, batch=b, delay=1, updates_per_batch=1, n_updates=2)
    t1 = (1 - a) ** 2 + a * a / b
    # theta2 = (1 - a) - a e1 - a (1 + e2) -> mean 1 - 2a, var a^2 (1/b + 1/b)
    t2 = (1 - 2 * a) ** 2 + 2 * a * a / b
    assert got == pytest.approx([0.5 * t1, 0.5 * t2])
    # u = 2 reuses the noise: theta2 = (1 - a) theta1 - a e with the same e -> var ((1 - a) a + a)^2 / b
    got2 = expected_async_losses(cfg, lr=a, batch=b, delay=0, updates_per_batch=2, n_updates=2)
    t2u = (1 - a) ** 4 + ((1 - a) * a + a) ** 2 / b
    assert got2[1] == pytest.approx(0.5 * t2u)


def test_delay_lowers_the_stability_edge() -> None:
    # lr h_max = 1.2: stable on-policy (edge 2), unstable with a one-update delay (edge 1)
    kw = dict(lr=1.2, batch=64, updates_per_batch=1, target_loss=1e-3, max_updates=4000)
    assert math.isinf(expected_async_samples_to_target(CFG, delay=1, **kw))  # type: ignore[arg-type]
    fine = expected_async_losses(CFG, lr=1.2, batch=64, delay=0, updates_per_batch=1, n_updates=400)
    assert fine[-1] < fine[0]


def test_drawn_runs_agree_with_the_expectation() -> None:
    kw = dict(lr=0.4, batch=16, delay=1, updates_per_batch=2)
    losses = expected_async_losses(CFG, n_updates=400, **kw)  # type: ignore[arg-type]
    target = float(losses[0] + losses[-1]) / 4
    truth = expected_async_samples_to_target(CFG, target_loss=target, **kw)  # type: ignore[arg-type]
    mean_r, per_seed = simulate_samples_to_target(CFG, target_loss=target, seeds=list(range(16)), **kw)  # type: ignore[arg-type]
    assert len(per_seed) == 16 and all(math.isfinite(r) for r in per_seed)
    assert mean_r == pytest.approx(truth, rel=0.15)


def test_the_shrunk_window_does_not_read_a_convex_approach_late() -> None:
    # near noise-free, so the 64-seed mean curve is the expected one: the shipped full-width centred
    # average lifts its convex approach (Jensen) and reads it 1.8% late; shrink_from=8 does not
    cfg = NQMConfig(dim=16, noise_scale=1e-6)
    kw = dict(lr=0.4, batch=16, delay=1, updates_per_batch=2)
    losses = expected_async_losses(cfg, n_updates=400, **kw)  # type: ignore[arg-type]
    target = float(losses[0] + losses[-1]) / 4
    truth = expected_async_samples_to_target(cfg, target_loss=target, **kw)  # type: ignore[arg-type]
    seeds = list(range(64))
    new, per_seed = simulate_samples_to_target(cfg, target_loss=target, seeds=seeds, shrink_from=8, **kw)  # type: ignore[arg-type]
    old, _ = simulate_samples_to_target(cfg, target_loss=target, seeds=seeds, **kw)  # type: ignore[arg-type]
    assert new == pytest.approx(truth, rel=0.002)
    assert old > 1.01 * truth  # the shipped reading's floor
    assert per_seed[0] > 1.01 * truth  # one seed's curve keeps the full width
    # read_crossing alone: exp(-n / 50) reaches e^-2 at update n = 100, i.e. after 101 samples
    curve, t = np.exp(-np.arange(400) / 50.0), math.exp(-2)
    assert (
        probe_half_width(curve, t, 64)
        == probe_half_width(curve, t, 1, 8)
        == probe_half_width(curve, t, 8, 8)
        == 25
    )
    assert probe_half_width(curve, t, 64, 8) == 3
    exact = read_crossing(curve, target_loss=t, batch=1, updates_per_batch=1, loss0=2.0, half_width=0)
    late = read_crossing(curve, target_loss=t, batch=1, updates_per_batch=1, loss0=2.0, half_width=25)
    assert exact == pytest.approx(101, abs=0.02) and late > 102.5


def test_isotonic_reading_ignores_a_lucky_point_and_keeps_the_blow_up_rule() -> None:
    # exp(-n / 50) is already non-increasing: its fit is itself, read at update 100 (101 samples);
    # one lucky point below the target at update 60 is read there raw, but the fit pools it with
    # its neighbours; a blow-up after the crossing (inf) rejects the run; B / u scales the samples
    curve, t = np.exp(-np.arange(400) / 50.0), math.exp(-2)
    kw = dict(target_loss=t, updates_per_batch=1, loss0=2.0)
    assert read_isotonic_crossing(curve, batch=1, **kw) == pytest.approx(101, abs=1e-9)  # type: ignore[arg-type]
    scaled = read_isotonic_crossing(curve, batch=8, target_loss=t, updates_per_batch=2, loss0=2.0)
    assert scaled == pytest.approx(404)
    lucky = curve.copy()
    lucky[60] = 0.1
    assert 60 < read_crossing(lucky, batch=1, half_width=0, **kw) < 61  # type: ignore[arg-type]
    assert read_isotonic_crossing(lucky, batch=1, **kw) == pytest.approx(101, abs=0.5)  # type: ignore[arg-type]
    blown = curve.copy()
    blown[300:] = np.inf
    assert read_isotonic_crossing(blown, batch=1, **kw) == math.inf  # type: ignore[arg-type]
    assert read_isotonic_crossing(curve[:50], batch=1, **kw) == math.inf  # type: ignore[arg-type]
    with pytest.raises(AnalysisError):
        simulate_samples_to_target(
            CFG, lr=0.1, batch=8, delay=0, updates_per_batch=1, target_loss=0.1, seeds=[0], reading="iso"
        )


def test_the_step_end_truth_reads_after_each_batch() -> None:
    kw = dict(lr=0.4, batch=16, delay=1)
    losses = expected_async_losses(CFG, updates_per_batch=4, n_updates=400, **kw)  # type: ignore[arg-type]
    target = float(losses[0] + losses[-1]) / 4
    # u = 1: a step is an update, the two truths agree
    one = dict(kw, updates_per_batch=1, target_loss=target)
    assert expected_async_step_samples_to_target(CFG, **one) == expected_async_samples_to_target(CFG, **one)  # type: ignore[arg-type]
    # u = 4, by hand: the first step end j (update 4j + 3) at or below the target, linear from the last
    ends = losses[3::4]
    j = int(np.flatnonzero(ends <= target)[0])
    frac = (ends[j - 1] - target) / (ends[j - 1] - ends[j])
    got = expected_async_step_samples_to_target(CFG, updates_per_batch=4, target_loss=target, **kw)  # type: ignore[arg-type]
    assert got == pytest.approx(16 * (j + frac), rel=1e-12)
    assert got >= expected_async_samples_to_target(CFG, updates_per_batch=4, target_loss=target, **kw)  # type: ignore[arg-type]
    # never reached: inf, as the per-update truth
    assert math.isinf(expected_async_step_samples_to_target(CFG, updates_per_batch=4, target_loss=-1.0, **kw))  # type: ignore[arg-type]


def test_the_drawn_probe_read_at_step_ends() -> None:
    kw = dict(lr=0.4, batch=16, delay=1)
    target = 1.5 * float(expected_async_losses(CFG, updates_per_batch=4, n_updates=200, **kw)[-1])  # type: ignore[arg-type]
    # u = 1: the same reading; per_seed=False keeps the mean and skips the seeds' own crossings
    one = dict(kw, updates_per_batch=1, target_loss=target, seeds=list(range(8)))
    upd, per = simulate_samples_to_target(CFG, **one)  # type: ignore[arg-type]
    step, none = simulate_samples_to_target(CFG, at="step", per_seed=False, **one)  # type: ignore[arg-type]
    assert step == upd and len(per) == 8 and none == []
    # u = 4: read only after each batch's 4 updates, so near the step-end truth (25% above the
    # per-update one here), not the per-update truth
    four = dict(kw, updates_per_batch=4, target_loss=target)
    got, _ = simulate_samples_to_target(CFG, seeds=list(range(64)), at="step", **four)  # type: ignore[arg-type]
    assert got == pytest.approx(expected_async_step_samples_to_target(CFG, **four), rel=0.1)  # type: ignore[arg-type]
    assert got > 1.1 * expected_async_samples_to_target(CFG, **four)  # type: ignore[arg-type]
    with pytest.raises(AnalysisError):
        simulate_samples_to_target(CFG, at="batch", **one)  # type: ignore[arg-type]


def test_bad_input() -> None:
    with pytest.raises(AnalysisError):
        expected_async_losses(CFG, lr=0.1, batch=0, delay=0, updates_per_batch=1, n_updates=3)
