"""R(B, k, u) of off-policy branches (analysis/branched/offpolicy.py): paired with the on-policy batch
seed by seed; a cell with a censored seed is never ranked as if it reached the target."""

from __future__ import annotations

import math

import pytest

from batchtune.analysis.branched.offpolicy import OffPolicyInput, offpolicy_estimates
from batchtune.analysis.sample.efficiency import CandidateEfficiency


def _cand(label: str) -> CandidateEfficiency:
    return CandidateEfficiency(
        label, 32, 8, 0.1, "sqrt", "main", None, None, 3, (), 1.0, 1.0, 0.0, 1000, 1.0
    )  # fmt: skip


def test_paired_ratios_scale_r_of_the_batch_seed_by_seed() -> None:
    base = {"P32xG8": {0: (1.0, False), 1: (1.2, False)}}
    off = [OffPolicyInput(_cand("P32xG8-k1u1"), "P32xG8", {0: (1.1, False), 1: (1.0, False)})]
    (est,), _ = offpolicy_estimates(off, base, 1000.0, 0.9)
    assert est.family == "offpolicy" and est.estimate is not None
    assert est.estimate.samples_to_target == pytest.approx(1000.0 * math.sqrt(1.1 * 1.2))


def test_a_censored_seed_makes_r_a_lower_bound_ranked_as_not_reached() -> None:
    """Two of three k = 2 branches never reached the level: at their bounds the geometric mean read
    below a fully measured k = 1 (21,537 against 21,824 on the NQM) and the ranking picked a cell
    that never reaches the target in expectation."""
    base = {"P32xG8": {s: (1.0, False) for s in range(3)}}
    off = [
        OffPolicyInput(_cand("P32xG8-k2u1"), "P32xG8", {0: (2.1, True), 1: (2.2, True), 2: (1.3, False)}),
        OffPolicyInput(_cand("P32xG8-k1u1"), "P32xG8", {s: (1.9, False) for s in range(3)}),
    ]
    (k2, k1), notes = offpolicy_estimates(off, base, 1000.0, 0.9)
    assert k2.estimate is not None and math.isinf(k2.estimate.samples_to_target)
    assert k2.estimate.ci_low > 1000.0 and math.isinf(k2.estimate.ci_high)
    assert k1.estimate is not None and math.isfinite(k1.estimate.samples_to_target)
    assert any(n.startswith("P32xG8-k2u1: 2 of 3 seed(s) did not reach") for n in notes)
