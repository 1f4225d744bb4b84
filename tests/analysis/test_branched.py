"""Branched-probe analysis: local ratios on curves of known slowdown, the progress fit and the
trunk extrapolation recover what generated them (seeded)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchtune.analysis.branched.progress import extrapolate_to_target, fit_progress
from batchtune.analysis.branched.ratios import (
    ADOPT,
    MORE,
    REJECT,
    BranchCurve,
    adoption,
    local_critical_batch,
)
from batchtune.errors import AnalysisError


def _branch(batch: float, seed: int, slowdown: float, rng: np.random.Generator) -> BranchCurve:
    """A loss falling linearly from 2.0 at 1/slowdown the control's rate, logged every batch."""
    s = np.arange(batch, 2.5 * 1024 + batch, batch)
    v = 2.0 - 1e-3 * s / slowdown + rng.normal(0, 1e-4, s.size)
    return BranchCurve(batch=batch, seed=seed, samples=s, values=v, consumed=float(s[-1]))


def test_local_critical_batch_reads_known_slowdowns() -> None:
    rng = np.random.default_rng(0)
    slow = {8: 1.0, 32: 1.0, 128: 1.03, 512: 1.5}
    curves = [
        _branch(b, s, k * (1 + 0.01 * s), rng) if b != 8 else _branch(b, s, 1 + 0.01 * s, rng)
        for b, k in slow.items()
        for s in range(3)
    ]
    lc = local_critical_batch(
        4096, 2.0, curves, reference_batch=8, window_samples=1024, higher_is_better=False, tol=0.1
    )
    assert lc.level == pytest.approx(2.0 - 1e-3 * 1024 / 1.01, abs=2e-3)
    for b, k in slow.items():
        assert np.median(list(lc.ratios[b].values())) == pytest.approx(k, rel=0.03)
    lo, hi = lc.interval
    assert 128 <= lc.point <= 512 and lo <= lc.point <= hi


def test_a_plateau_after_the_checkpoint_is_a_clear_error_not_a_zero_ratio() -> None:
    """Controls that end the window no better than the checkpoint: every branch would 'reach' the
    local target at 0 samples; say why instead of dividing 0 by 0."""
    s = np.arange(8.0, 2048.0, 8.0)
    flat = [
        BranchCurve(batch=8, seed=k, samples=s, values=np.full(s.size, 1.5), consumed=2048.0)
        for k in range(2)
    ]
    with pytest.raises(AnalysisError, match="no progress in the window after the checkpoint at 4096"):
        local_critical_batch(4096, 1.5, flat, reference_batch=8, window_samples=1024, higher_is_better=False)
    # a pre-training probe's axis is tokens, and its errors say so
    with pytest.raises(AnalysisError, match="checkpoint at 4096 tokens .* window of 1024 tokens later"):
        local_critical_batch(
            4096, 1.5, flat, reference_batch=8, window_samples=1024, higher_is_better=False, unit="tokens"
        )


def test_fit_progress_recovers_a_power_trend() -> None:
    samples = np.array([1e3, 3e3, 1e4, 3e4])
    b = 50 * (samples / 1e3) ** 0.5
    fit = fit_progress(samples, b, [(x / 1.2, x * 1.2) for x in b])
    assert fit.slope == pytest.approx(0.5, abs=1e-6)
    p, lo, hi = fit.predict(1e5)
    assert p == pytest.approx(50 * 100**0.5, rel=1e-6) and lo < p < hi
    with pytest.raises(AnalysisError):
        fit_progress([1e3], [10.0], [(5.0, 20.0)])


def test_extrapolate_to_target_on_a_log_linear_curve() -> None:
    rng = np.random.default_rng(1)
    s = np.arange(64, 4096 + 1, 64, dtype=float)
    v = 3.0 - 0.5 * np.log(s / 64) + rng.normal(0, 0.01, s.size)
    true = 64 * math.exp((3.0 - 0.5) / 0.5)  # where 3 - 0.5 log(s/64) = 0.5
    p, lo, hi = extrapolate_to_target(s, v, 0.5, higher_is_better=False)
    assert lo <= true <= hi and p == pytest.approx(true, rel=0.1)
    r, r_lo, r_hi = extrapolate_to_target(s, v, 1.0, higher_is_better=False)  # reached: measured
    assert r == r_lo == r_hi and r < s[-1]


def test_extrapolation_interval_runs_from_the_curves_end_and_covers_a_curve_that_speeds_up() -> None:
    """An RL reward that creeps, then climbs (its late phase is not in the early part's noise): the
    point (log form) lands late, and the interval runs from where the curve stops (it has not reached
    the target there) to the latest form, so it still holds the true crossing."""
    rng = np.random.default_rng(3)
    s = np.arange(128, 8192 + 1, 128, dtype=float)
    v = 0.75 + 0.02 * np.log(s / 128) + 0.15 * np.clip((s - 2048) / 4096, 0, None) ** 1.5
    v = v + rng.normal(0, 0.005, s.size)
    true = float(s[np.argmax(v >= 0.9)])
    cut = s <= 2048
    p, lo, hi = extrapolate_to_target(s[cut], v[cut], 0.9, higher_is_better=True)
    assert lo == s[cut][-1] and lo <= true <= hi and p > 1.5 * true


def _line(batch: float, seed: int, slope: float, end: float, floor: float = -math.inf) -> BranchCurve:
    """Loss 2 - slope * samples, never below ``floor``, logged every batch up to ``end`` samples."""
    s = np.arange(batch, end + batch, batch)
    v = np.maximum(2.0 - slope * s, floor)
    return BranchCurve(batch=batch, seed=seed, samples=s, values=v, consumed=float(s[-1]))


def test_a_batch_with_its_own_longer_window_shows_what_one_step_hides() -> None:
    """A large batch that matches the control over its single step, then stalls (a noise floor,
    an instability): over the common window of one step it reads as invariant; over its own window
    of 4 steps it never reaches the control's level there. A batch with its own window and a known
    slowdown lands on the common scale at that slowdown."""
    curves = [_line(8, s, 2e-4, 1.25 * 4096) for s in range(2)]
    curves += [_line(1024, s, 2.2e-4, 8192, floor=1.77) for s in range(2)]  # 1 step: 1.775 < level 1.795
    curves += [_line(512, s, 2e-4 / 1.5, 8192) for s in range(2)]
    kw = dict(reference_batch=8, window_samples=1024, higher_is_better=False, tol=0.1)
    short = local_critical_batch(4096, 2.0, curves, **kw)  # type: ignore[arg-type]
    assert all(r <= 1.0 for r in short.ratios[1024.0].values()) and short.point >= 1024
    own = local_critical_batch(4096, 2.0, curves, windows={512: 2048, 1024: 4096}, **kw)  # type: ignore[arg-type]
    assert all(math.isinf(r) for r in own.ratios[1024.0].values())
    assert all(r == pytest.approx(1.5, rel=0.02) for r in own.ratios[512.0].values())
    r0 = own.estimates[8.0].samples_to_target
    assert own.estimates[512.0].samples_to_target == pytest.approx(1.5 * r0, rel=0.02)
    assert own.windows == {512.0: 2048.0, 1024.0: 4096.0} and own.level == short.level
    assert own.point < 512


def test_adoption_needs_seeds_that_agree_not_two_lucky_ones() -> None:
    kw = {"tol": 0.1, "confidence": 0.9, "min_seeds": 2, "max_seeds": 4}
    assert adoption([1.00, 0.98], **kw) == ADOPT  # agree, well within 1+tol
    assert adoption([0.99, 1.15], **kw) == MORE  # the mean is within, the bound is not
    assert adoption([0.99, 1.15, 0.94, math.inf], **kw) == REJECT  # a seed never reached the level
    assert adoption([1.02, 1.25], **kw) == REJECT  # the mean itself is past 1+tol
    assert adoption([0.95, 1.2, 0.95, 1.15], **kw) == REJECT  # still undecided at max_seeds
    assert adoption([1.0, math.nan], **kw) == REJECT  # a seed whose control never reached it
    assert adoption([1.0], **kw) == MORE
    assert adoption([1.05], **{**kw, "min_seeds": 1}) == ADOPT  # one seed: its point
    assert adoption([], **kw) == REJECT


def test_confirmed_rejections_need_seeds_unless_the_batch_is_clearly_behind() -> None:
    # branch.confirm_rejections: a mean past 1+tol is rejected on min_reject_seeds seeds, not one
    kw = {"tol": 0.1, "confidence": 0.9, "min_seeds": 3, "max_seeds": 4, "min_reject_seeds": 3}
    assert adoption([1.13], **kw) == MORE  # one seed just past 1+tol: branch another
    assert adoption([1.13, 1.15], **kw) == MORE
    assert adoption([1.13, 1.15, 1.12], **kw) == REJECT  # three seeds agree it is past
    assert adoption([1.13, 0.95, 1.0], **kw) == MORE  # the mean came back within: the usual test
    assert adoption([1.3], **kw) == REJECT  # past (1+tol)^2 = 1.21: one seed is enough
    assert adoption([1.05, math.inf], **kw) == REJECT  # a seed never reached the level
    assert adoption([1.13, 1.12, 1.11, 1.15], **{**kw, "min_reject_seeds": 9}) == REJECT  # max_seeds
    assert adoption([1.13], **{**kw, "min_reject_seeds": 1}) == REJECT  # the default: the first seed


def test_a_censored_branch_keeps_the_bound_it_reached_a_diverged_one_none() -> None:
    """A branch that stops short of the level is known to need more than it spent: its ratio is
    inf, and `bounds` holds samples spent / R_c(B0, s). A failed branch has no bound."""
    rng = np.random.default_rng(0)
    curves = [_branch(8, s, 1.0, rng) for s in range(2)]
    slow = _branch(512, 0, 3.0, rng)  # a third of the control's rate: never reaches the level
    s = slow.samples[slow.samples <= 1536]
    curves += [
        BranchCurve(batch=512, seed=0, samples=s, values=slow.values[: s.size], consumed=1536.0),
        BranchCurve(batch=512, seed=1, samples=s[:1], values=slow.values[:1], failed=True, consumed=512.0),
    ]
    lc = local_critical_batch(
        4096, 2.0, curves, reference_batch=8, window_samples=1024, higher_is_better=False, tol=0.1
    )
    assert lc.ratios[512.0] == {0: math.inf, 1: math.inf}
    assert lc.bounds[512.0] == {0: pytest.approx(1536.0 / 1024, rel=0.02)}


def test_the_local_critical_batch_interval_holds_its_point() -> None:
    """Flat ratios up to 512 and 1024 never reaching the level: the joint crossing is past every
    batch measured (no finite point), so the point is the walk's 512, and its interval holds it."""
    rng = np.random.default_rng(3)
    curves = [_branch(b, s, 1.0 + 0.002 * s, rng) for b in (8, 64, 256, 512) for s in range(3)]
    curves += [_branch(1024, s, 20.0, rng) for s in range(3)]
    lc = local_critical_batch(
        4096, 2.0, curves, reference_batch=8, window_samples=1024, higher_is_better=False, tol=0.1
    )
    lo, hi = lc.interval
    assert lo <= lc.point <= hi
