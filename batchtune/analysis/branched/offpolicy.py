"""R(B, k, u) of a branched probe's off-policy branches (measure/branched_async.py runs them).

Per seed s, the on-policy R(B, s) = R(B0) x ratio(B, s) (analysis/branched/summary.py), and the
off-policy branch of the same seed from the same checkpoint gives ratio_k(s) = R_c(B, k, u, s) /
R_c(B, 0, s) to one level, so R(B, k, u, s) = R(B, s) x ratio_k(s): paired with the on-policy batch
seed by seed on one samples axis. A seed censored on either side stays censored (its bound: the
samples where it stopped, scaled the same way). The estimate over seeds is the geometric mean with
its bootstrap interval, as the main candidates'. A candidate with any censored seed has R = inf
(its interval's low end the bound): a branch that does not reach, within its longest window, the
level the k = 0 branch reached is a delayed gradient past its stability edge or far slower, and
ranking it at its bound picked such a cell (it never reaches the target in expectation) on the
NQM (benchmarks/branched_async.py, seeds 3-5 of instance B). Pure, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from batchtune.analysis.sample.curves import TargetCrossing
from batchtune.analysis.sample.efficiency import CandidateEfficiency
from batchtune.analysis.sample.seeds import GEOMETRIC_MEAN, estimate_over_seeds

SeedRatios = Mapping[int, tuple[float, bool]]  # seed -> (ratio, censored)


@dataclasses.dataclass(frozen=True)
class OffPolicyInput:
    """One off-policy candidate: its timings and costs, the on-policy label it was paired with, and
    its per-seed ratios against that label's k = 0 branch."""

    candidate: CandidateEfficiency
    base: str
    ratios: SeedRatios


def offpolicy_estimates(
    offpolicy: Sequence[OffPolicyInput],
    base: Mapping[str, SeedRatios],
    r0: float,
    confidence: float,
) -> tuple[list[CandidateEfficiency], list[str]]:
    """(the off-policy candidates with their R estimates, notes): module docstring. ``base``: each
    main label's per-seed ratio to R(B0) (the reference: 1 at every seed); ``r0``: R(B0)."""
    out: list[CandidateEfficiency] = []
    notes: list[str] = []
    for o in offpolicy:
        mine = base.get(o.base, {})
        crossings, ids = [], []
        for s, (rk, cens_k) in sorted(o.ratios.items()):
            if s not in mine or not math.isfinite(rk):  # unpaired: the k = 0 side never got there
                continue
            rb, cens_b = mine[s]
            r = r0 * rb * rk if math.isfinite(rb) else math.inf
            if cens_k or cens_b or not math.isfinite(r):
                crossings.append(TargetCrossing(None, True, r if math.isfinite(r) else r0))
            else:
                crossings.append(TargetCrossing(r, False, r))
            ids.append(s)
        if not crossings:
            notes.append(f"{o.candidate.label}: no seed paired with {o.base}'s branches; not ranked")
            continue
        est = estimate_over_seeds(crossings, confidence=confidence, seed_ids=ids, statistic=GEOMETRIC_MEAN)
        cut = sum(c.censored for c in crossings)
        if cut:  # its point is only a lower bound: never ranked as if it were reached (module doc)
            est = dataclasses.replace(est, samples_to_target=math.inf, ci_high=math.inf)
            notes.append(
                f"{o.candidate.label}: {cut} of {len(crossings)} seed(s) did not reach the level its "
                f"k = 0 branch reached: R >= {est.ci_low:,.0f}, ranked as not reaching the target"
            )
        out.append(dataclasses.replace(o.candidate, estimate=est, family="offpolicy"))
    if out:
        notes.append(
            f"off-policy candidates ({', '.join(c.label for c in out)}) were branched at one checkpoint, "
            "paired seed by seed with their on-policy batch's k = 0 branch from it: R(B, k, u) = R(B) x "
            "that ratio (the staleness cost at the last checkpoint read); on the NQM "
            "the window read picked a candidate that never reaches the target in 2 of 12 probes, the "
            "read to the target (branch.offpolicy_read = 'target') none but still up to regret 1.740, "
            "the grid 1.000 in 6: prefer probe.mode = 'grid' for a staleness sweep (docs/async.md)"
        )
    return out, notes
