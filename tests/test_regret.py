"""The ground-truth regret benchmark (benchmarks/regret.py) as a test, with its tolerances.

Default suite: two synthetic RL cases (R(B) = E_min (1 + B/B_crit) exactly, a known Θ(B); < 2 s):
regret <= 1.05 and the critical batch within one grid step of the truth. Slow: two NQM instances
run through probe, profile and recommend against the closed form (~20 s of CPU each).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from regret_cases import QUICK_NQM, QUICK_SYN, run_nqm_case, run_synthetic_case  # noqa: E402

REGRET_TOL = 1.05


@pytest.mark.parametrize(("b_crit", "group"), QUICK_SYN)
def test_synthetic_curves_recommend_within_5_percent_of_the_best(b_crit, group):
    case = run_synthetic_case(b_crit, group)
    assert case.regret <= REGRET_TOL, case
    assert case.critical_steps_off <= 1, case
    assert case.crossing is not None and abs(case.crossing / case.true_crossing - 1) <= 0.15, case


@pytest.mark.slow
@pytest.mark.parametrize("name", QUICK_NQM)
def test_nqm_instances_recommend_within_5_percent_of_the_best(name, tmp_path):
    case = run_nqm_case(name, str(tmp_path))
    assert case.regret <= REGRET_TOL, case
    assert case.critical_steps_off <= 1, case
