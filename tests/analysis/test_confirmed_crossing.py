"""The probe's stop check `confirmed_crossing` decides exactly as the full fit does, everywhere."""

from __future__ import annotations

import numpy as np
import pytest

from batchtune.analysis.sample.curves import confirmed_crossing, samples_to_target, target_confirmed
from batchtune.analysis.sample.monotone import crossing_floor, monotone_crossing


def _curves(seed: int, n: int) -> list[tuple[np.ndarray, np.ndarray, float, bool]]:
    """Noisy learning curves of every shape the probe meets: rising rewards and falling losses,
    noise from none to larger than the rise, targets on the slope and at the plateau, uneven and
    repeated sample counts (several evaluations at one step)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        points = int(rng.integers(3, 60))
        steps = rng.integers(0, 4, size=points) * int(rng.choice([1, 8, 64]))  # 0: a repeated count
        samples = np.cumsum(steps).astype(float) + float(rng.integers(0, 100))
        scale = float(rng.uniform(0.2, 3.0)) * samples[-1] + 1.0
        clean = 1.0 - np.exp(-samples / scale)
        noisy = clean + rng.normal(0.0, float(rng.choice([0.0, 0.01, 0.05, 0.2])), size=points)
        target = float(rng.uniform(0.1, 1.0)) * float(clean[-1]) if rng.random() < 0.8 else float(clean[-1])
        higher = bool(rng.random() < 0.5)
        sign = 1.0 if higher else -1.0
        out.append((samples, sign * noisy, sign * target, higher))
    return out


def _old_rule(s: np.ndarray, m: np.ndarray, target: float, higher: bool) -> float | None:
    crossing = samples_to_target(s, m, target, higher_is_better=higher)
    return crossing.samples_to_target if target_confirmed(crossing) else None


def _check_all_prefixes(seed: int, n: int) -> tuple[int, int, int]:
    """Every evaluation of n curves, as the probe asks: (checks, confirmed, past the shortcut)."""
    checked = confirmed = full = 0
    for samples, metric, target, higher in _curves(seed, n):
        sign = 1.0 if higher else -1.0
        for end in range(1, samples.size + 1):
            s, m = samples[:end], metric[:end]
            new = confirmed_crossing(s, m, target, higher_is_better=higher)
            assert (None if new is None else new.samples_to_target) == _old_rule(s, m, target, higher)
            floor = crossing_floor(s, sign * m, sign * target)
            checked += 1
            confirmed += new is not None
            full += floor is not None and s.max() >= 1.25 * floor
    return checked, confirmed, full


def test_the_stop_check_confirms_at_the_same_points_with_the_same_r_as_the_full_fit():
    checked, confirmed, full = _check_all_prefixes(0, 25)
    # both decisions occur, and both the shortcut and the full fit decide some of them
    assert checked > 400 and 20 < confirmed < full < checked


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 6))
def test_the_stop_check_agrees_with_the_full_fit_on_many_more_curves(seed):
    checked, confirmed, full = _check_all_prefixes(seed, 200)
    assert checked > 4000 and 0 < confirmed < full < checked


def test_the_floor_bounds_the_crossing_and_is_censored_exactly_when_it_is():
    for samples, metric, target, higher in _curves(7, 200):
        sign = 1.0 if higher else -1.0
        r = monotone_crossing(samples, sign * metric, sign * target)
        floor = crossing_floor(samples, sign * metric, sign * target)
        assert (r is None) == (floor is None)
        if r is not None and floor is not None:
            assert floor <= r
