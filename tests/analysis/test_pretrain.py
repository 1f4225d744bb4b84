"""Pre-training: steps-data hyperbola, WSD E(S), reference fits, schedules (docs/method.md §6)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchtune.analysis.pretrain.steps_data import (
    ScheduleStage,
    deepseek_bopt,
    deepseek_lr,
    fit_steps_data,
    fit_wsd_data_curve,
    kaplan_critical_batch,
    merrill_batch_warmup,
    schedule_from_bopt,
)
from batchtune.errors import AnalysisError

S_MIN, E_MIN = 1000.0, 2e9  # steps, tokens -> B_crit = 2e6 tokens
BATCHES = np.array([2.5e5, 5e5, 1e6, 2e6, 4e6, 8e6, 1.6e7])


def hyperbola_points(noise: float = 0.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    steps = S_MIN * (1 + (E_MIN / S_MIN) / BATCHES) * np.exp(rng.normal(0, noise, BATCHES.size))
    return steps, BATCHES * steps


# --- McCandlish hyperbola ------------------------------------------------------------------------


def test_steps_data_recovers_exact_parameters():
    fit = fit_steps_data(*hyperbola_points())
    assert fit.s_min_steps == pytest.approx(S_MIN, rel=1e-8)
    assert fit.e_min_tokens == pytest.approx(E_MIN, rel=1e-8)
    assert fit.b_crit_tokens == pytest.approx(E_MIN / S_MIN, rel=1e-8)
    assert fit.residual_rms_log < 1e-8
    s, e = fit.predict_steps(BATCHES), fit.predict_tokens(BATCHES)
    np.testing.assert_allclose((s / S_MIN - 1) * (e / E_MIN - 1), 1.0, rtol=1e-8)


def test_steps_data_noisy_recovery_and_ci():
    covered = 0
    for seed in range(20):
        fit = fit_steps_data(*hyperbola_points(noise=0.03, seed=seed))
        assert fit.b_crit_tokens == pytest.approx(2e6, rel=0.15)
        for (lo, hi), value in (
            (fit.s_min_ci, fit.s_min_steps),
            (fit.b_crit_ci, fit.b_crit_tokens),
        ):
            assert lo < value < hi
        covered += fit.b_crit_ci[0] <= 2e6 <= fit.b_crit_ci[1]
    assert covered >= 16  # nominal 95%: allow some misses over 20 seeds
    assert fit.n_points == BATCHES.size and fit.confidence == 0.95


def test_steps_data_rejects_degenerate_input():
    s, e = hyperbola_points()
    with pytest.raises(AnalysisError, match=">= 3"):
        fit_steps_data(s[:2], e[:2])
    with pytest.raises(AnalysisError):
        fit_steps_data([1000.0, 2000.0, np.nan], [1e9, 2e9, 3e9])
    with pytest.raises(AnalysisError):
        fit_steps_data(s, e[:-1])
    with pytest.raises(AnalysisError, match=">= 3"):  # one batch measured three times
        fit_steps_data([1000.0, 2000.0, 3000.0], [1e9, 2e9, 3e9])
    # steps flat across batches: data grows in proportion to batch -> no trade-off visible
    with pytest.raises(AnalysisError, match="trade-off"):
        fit_steps_data(np.full(BATCHES.size, 1000.0), BATCHES * 1000.0)
    # perfect scaling: data constant, steps fall in proportion to batch -> no trade-off visible
    steps = 1e10 / BATCHES
    with pytest.raises(AnalysisError, match="trade-off"):
        fit_steps_data(steps, BATCHES * steps)


# --- WSD E(S) ------------------------------------------------------------------------------------

# piecewise truth (Zhou et al. 2026 form); each stage sampled on its own steps
EARLY = dict(b=1e12, s_min=600.0, e0=4.4e9)
MID = dict(c=4000.0, s_opt=2000.0, e_min=4e9)
LATE = dict(a1=1.5e6, a0=0.5e9)


def piecewise_points() -> tuple[np.ndarray, np.ndarray]:
    s_early = np.array([800.0, 1000.0, 1200.0, 1400.0])
    s_mid = np.array([1700.0, 2000.0, 2300.0])
    s_late = np.array([3000.0, 4000.0, 6000.0, 8000.0, 12000.0])
    e = np.concatenate(
        [
            EARLY["b"] / (s_early - EARLY["s_min"]) + EARLY["e0"],
            MID["c"] * (s_mid - MID["s_opt"]) ** 2 + MID["e_min"],
            LATE["a1"] * s_late + LATE["a0"],
        ]
    )
    return np.concatenate([s_early, s_mid, s_late]), e


def test_wsd_recovers_piecewise_parameters():
    s, e = piecewise_points()
    fit = fit_wsd_data_curve(s[::-1], e[::-1])  # order does not matter
    assert fit.n_points_per_stage == (4, 3, 5)
    assert fit.s_opt_steps == pytest.approx(MID["s_opt"], rel=1e-6)
    assert fit.e_min_tokens == pytest.approx(MID["e_min"], rel=1e-6)
    assert fit.c_quadratic == pytest.approx(MID["c"], rel=1e-6)
    assert fit.a1_tokens_per_step == pytest.approx(LATE["a1"], rel=1e-6)
    assert fit.a0_tokens == pytest.approx(LATE["a0"], rel=1e-5)
    assert fit.b_early == pytest.approx(EARLY["b"], rel=1e-4)
    assert fit.s_min_steps == pytest.approx(EARLY["s_min"], rel=1e-4)
    assert fit.e0_tokens == pytest.approx(EARLY["e0"], rel=1e-4)
    assert fit.b_opt_tokens == pytest.approx(MID["e_min"] / MID["s_opt"], rel=1e-6)  # 2e6
    assert fit.b_min_tokens == pytest.approx(LATE["a1"], rel=1e-6)
    assert fit.b_min_tokens < fit.b_opt_tokens
    np.testing.assert_allclose(fit.predict_tokens(s), e, rtol=1e-4)
    assert max(fit.residual_rms_rel_per_stage) < 1e-4
    assert 1400 < fit.split_steps[0] < 1700 and 2300 < fit.split_steps[1] < 3000


def test_wsd_on_smooth_noisy_curve():
    # one smooth E(S) with all three behaviours: b/(S - S_min) early, a minimum, slope A1 late
    b, s_min, a1, a0 = 4e12, 500.0, 1e6, 2e8
    s = np.geomspace(560, 40_000, 24)
    rng = np.random.default_rng(3)
    e = (b / (s - s_min) + a1 * s + a0) * np.exp(rng.normal(0, 0.005, s.size))
    s_opt = s_min + math.sqrt(b / a1)  # 2500 steps
    e_min = b / (s_opt - s_min) + a1 * s_opt + a0  # 4.7e9 tokens
    fit = fit_wsd_data_curve(s, e)
    assert fit.b_opt_tokens == pytest.approx(e_min / s_opt, rel=0.15)
    assert fit.b_min_tokens == pytest.approx(a1, rel=0.15)
    assert fit.e_min_tokens == pytest.approx(e_min, rel=0.03)


def test_wsd_explicit_split_matches_automatic():
    s, e = piecewise_points()
    auto = fit_wsd_data_curve(s, e)
    manual = fit_wsd_data_curve(s, e, split_steps=(1500.0, 2500.0))
    assert manual.b_opt_tokens == pytest.approx(auto.b_opt_tokens)
    assert manual.b_min_tokens == pytest.approx(auto.b_min_tokens)


def test_wsd_errors_name_the_stage():
    s, e = piecewise_points()
    with pytest.raises(AnalysisError, match="late stage"):
        fit_wsd_data_curve(s[:-4], e[:-4])
    with pytest.raises(AnalysisError, match="early stage"):
        fit_wsd_data_curve(s[2:], e[2:])
    with pytest.raises(AnalysisError, match="edge"):
        fit_wsd_data_curve(s[:5], e[:5])  # minimum of E at the last point
    with pytest.raises(AnalysisError):
        fit_wsd_data_curve(s, e, split_steps=(2500.0, 1500.0))
    with pytest.raises(AnalysisError):
        fit_wsd_data_curve(s, np.where(s == 2000.0, np.nan, e))
    with pytest.raises(AnalysisError, match="distinct"):
        fit_wsd_data_curve(np.append(s, s[0]), np.append(e, e[0]))


# --- reference fits ------------------------------------------------------------------------------


def test_kaplan_critical_batch():
    assert kaplan_critical_batch(1.0) == pytest.approx(2e8)
    # B_crit(L) = 2e8 / L^(1/0.21): at L = 2.5 nats, 2e8 / 2.5^4.762 = 2.51e6 tokens
    assert kaplan_critical_batch(2.5) == pytest.approx(2e8 / 2.5 ** (1 / 0.21))
    values = kaplan_critical_batch([4.0, 3.0, 2.0])
    assert np.all(np.diff(values) > 0)  # lower loss -> larger critical batch
    with pytest.raises(AnalysisError):
        kaplan_critical_batch(0.0)


def test_deepseek_fits():
    c = 1e21
    assert deepseek_bopt(c) == pytest.approx(0.292 * c**0.3271)
    assert deepseek_lr(c) == pytest.approx(0.3118 * c**-0.125)
    assert deepseek_bopt(1e20) < deepseek_bopt(1e22)
    assert deepseek_lr(1e20) > deepseek_lr(1e22)
    np.testing.assert_allclose(deepseek_bopt([1e20, 1e21]), [deepseek_bopt(1e20), deepseek_bopt(c)])
    with pytest.raises(AnalysisError):
        deepseek_lr(-1.0)


# --- schedules -----------------------------------------------------------------------------------


def test_schedule_qwen3_example_sqrt_lr():
    # Zhou et al. 2026 on Qwen3: 2M -> 4M -> 5M -> 6M tokens per batch, a step every 125B tokens
    stages = schedule_from_bopt([0, 125e9, 250e9, 375e9], [2e6, 4e6, 5e6, 6e6], base_lr=3e-4)
    assert [s.start_tokens for s in stages] == [0, 125e9, 250e9, 375e9]
    assert [s.batch_tokens for s in stages] == [2e6, 4e6, 5e6, 6e6]
    lrs = [s.lr for s in stages]
    np.testing.assert_allclose(lrs, 3e-4 * np.sqrt([1, 2, 2.5, 3]))
    assert all(s.weight_decay is None for s in stages)


def test_schedule_rules_rounding_and_weight_decay():
    lin = schedule_from_bopt([0, 1e9], [1e6, 2e6], 1e-3, rule="linear", weight_decay=0.1)
    assert [s.lr for s in lin] == pytest.approx([1e-3, 2e-3])
    assert lin[1] == ScheduleStage(1e9, 2e6, pytest.approx(2e-3), 0.1)
    fixed = schedule_from_bopt([0, 1e9], [1e6, 2e6], 1e-3, rule="none")
    assert [s.lr for s in fixed] == [1e-3, 1e-3]
    rounded = schedule_from_bopt([0, 1e9], [1.0e6, 3.3e6], 1e-3, batch_multiple_tokens=4096 * 64)
    assert [s.batch_tokens for s in rounded] == [4 * 262144, 13 * 262144]
    table = schedule_from_bopt(
        [0, 1e9], [1e6, 2e6], 1e-3, rule="table", lr_table={1_000_000: 1e-3, 2_000_000: 1.2e-3}
    )
    assert [s.lr for s in table] == [1e-3, 1.2e-3]


@pytest.mark.parametrize(
    ("starts", "batches", "kwargs"),
    [
        ([1e9, 2e9], [1e6, 2e6], {}),  # does not start at 0
        ([0, 2e9, 1e9], [1e6, 2e6, 3e6], {}),  # not increasing
        ([0, 1e9], [1e6], {}),
        ([0, 1e9], [1e6, 0.0], {}),
        ([0, 1e9], [1e6, 2e6], {"rule": "cubic"}),
        ([0, 1e9], [1e6, 2e6], {"rule": "table", "lr_table": {1_000_000: 1e-3}}),  # 2e6 missing
    ],
)
def test_schedule_rejects_bad_input(starts, batches, kwargs):
    with pytest.raises(AnalysisError):
        schedule_from_bopt(starts, batches, 1e-3, **kwargs)


def test_merrill_batch_warmup():
    steps = merrill_batch_warmup([1.0, 3.0, 5.0, 9.0, 20.0, 20.0], current_batch=1.0, lr=1.0,
                                 at_tokens=[0, 1, 2, 3, 4, 5])  # fmt: skip
    # 3 > 2*1, 5 > 2*2, 9 > 2*4, 20 > 2*8: double each time; 20 < 2*16: hold
    assert [s.doubled for s in steps] == [False, True, True, True, True, False]
    assert [s.batch for s in steps] == [1, 2, 4, 8, 16, 16]
    np.testing.assert_allclose([s.lr for s in steps], np.sqrt([1, 2, 4, 8, 16, 16]))
    assert steps[-1].at_tokens == 5.0 and steps[0].index == 0
    with pytest.raises(AnalysisError):
        merrill_batch_warmup([1.0, np.nan], 1.0, 1.0)
    with pytest.raises(AnalysisError):
        merrill_batch_warmup([1.0], 1.0, 1.0, at_tokens=[0, 1])
