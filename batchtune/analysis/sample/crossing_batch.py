"""Which measured batch is the critical batch, given the 1+tol crossings and the per-batch verdicts.

Two crossings are at hand (critical.py): the shape-free one (intervals.shape_free_crossing, the one
every report quotes; its 90% interval covers 85-95% on McCandlish and NQM curves alike) and the
joint fit's (joint.fit_joint; its interval holds only if its shape does: 36% on the NQM). The
critical batch is read as follows (benchmarks/out/critical_recovery.txt measures it against the
truth, both answers side by side):
- Where the joint McCandlish shape holds (the power law fits no better than AIC 2: `delta_aic` <= 2),
  its crossing and interval give the batch and `lower` / `upper` (`from_fit`): it pools every batch
  through the shape, where the shape-free reading of each batch is noisier (exact in 93% of
  McCandlish repetitions against 75%).
- Where the shape is rejected (delta_aic > 2: the NQM's flat-then-steep R(B)), `lower` / `upper`
  come from the quoted shape-free interval and the batch is the larger of the two readings, kept
  inside that interval's measured bracket. The fit's crossing reads low there (it is bent toward the
  steep end: exact 68% on the NQM); the shape-free one reads low when the reference itself reads
  low by noise (it does not smooth R(B0): a 3-seed reference 8% low puts every batch above 1+tol).
  Each alone was more than one grid step low in NQM repetitions where the other was not.
- `lower` / `upper`: the largest measured batch at or below the interval (at least B0) and the
  smallest above it (else the first failed batch; None: "at least"). Last, the per-batch verdicts
  bound the batch (`respect_verdicts`): measured points overrule either crossing.
Without the shape-free crossing (too few runs) the joint fit's crossing and interval decide alone.
"""

from __future__ import annotations

import math

import numpy as np

from batchtune.analysis.sample.intervals import ShapeFreeCrossing
from batchtune.analysis.sample.joint import JointFit
from batchtune.analysis.sample.ratio import DEVIATES, INVARIANT, Verdict

# delta_aic (McCandlish - power) above which the McCandlish crossing is not trusted: the margin from
# which joint.py already calls the flexible shape the better fit (_AIC_AMBIGUOUS), not a tuned value
SHAPE_REJECTED = 2.0


def respect_verdicts(
    ascending: list[Verdict],
    measured: np.ndarray,
    crit: float,
    lower: float,
    upper: float | None,
    b0: float,
) -> tuple[float, float, float | None, str]:
    """Keep the crossing's answer inside the measured bracket: no crossing overrules measured points.

    A batch whose whole ratio interval is within 1 + tol ("invariant") is at or below the critical
    batch; one whose whole interval is above ("deviates") is above it. When they agree with each
    other, the estimate is moved into [largest invariant, smallest deviating) and `lower` / `upper`
    are tightened to them; when they conflict (noise), the crossing decides.
    """
    inv = [v.batch for v in ascending if v.status == INVARIANT and v.batch in measured]
    dev = [v.batch for v in ascending if v.status == DEVIATES]
    lo_ev, hi_ev = max(inv, default=b0), min(dev, default=math.inf)
    if lo_ev >= hi_ev:
        return crit, lower, upper, ""
    below = measured[measured < hi_ev]
    new = float(min(max(crit, lo_ev), below.max()))
    lower = max(lower, lo_ev)
    upper = hi_ev if upper is None or hi_ev < upper else upper
    if upper is not None and upper <= new:  # the interval ended below a measured invariant
        above = measured[measured > new]
        upper = hi_ev if math.isfinite(hi_ev) else (float(above.min()) if above.size else None)
    if upper is not None and math.isinf(upper):
        upper = None
    why = (
        ""
        if new == crit
        else f"the crossing alone says {crit:g}; the measured verdicts bracket it at {new:g}"
    )
    return new, min(lower, new), upper, why


def at_or_below(measured: np.ndarray, x: float, b0: float) -> float:
    """The largest measured batch at or below x (B0 when none is)."""
    return float(max(measured[measured <= x].max(initial=b0), b0))


def bracket(
    ci: tuple[float, float], measured: np.ndarray, b0: float, failed_from: float | None
) -> tuple[float, float | None]:
    """(lower, upper) of an interval: the largest measured batch at or below it (at least B0) and
    the smallest above it (else `failed_from`)."""
    above = measured[measured > ci[1]]
    return at_or_below(measured, ci[0], b0), float(above.min()) if above.size else failed_from


def from_fit(
    joint: JointFit, ascending: list[Verdict], measured: np.ndarray, b0: float, failed_from: float | None
) -> tuple[float, float, float | None, str]:
    """(batch, lower, upper, clamp note) from the joint fit's crossing and interval alone, clamped by
    the verdicts: the answer without a shape-free crossing, else a diagnostic."""
    f = joint.best
    lower, upper = bracket(f.crossing_ci, measured, b0, failed_from)
    return respect_verdicts(ascending, measured, at_or_below(measured, f.crossing, b0), lower, upper, b0)


def shape_rejected(joint: JointFit | None) -> bool:
    """The power law fits better than McCandlish's shape by more than SHAPE_REJECTED in AIC."""
    return joint is not None and joint.delta_aic > SHAPE_REJECTED  # nan (no power fit): not rejected


def read_batch(
    joint: JointFit | None,
    shape_free: ShapeFreeCrossing,
    ascending: list[Verdict],
    measured: np.ndarray,
    b0: float,
    failed_from: float | None,
) -> tuple[float, float, float | None, str, str]:
    """(batch, lower, upper, what the batch was read from, the verdicts' clamp note or "") by the
    module's rule."""
    if joint is not None and not shape_rejected(joint):
        crit, lower, upper, clamp = from_fit(joint, ascending, measured, b0, failed_from)
        return crit, lower, upper, "the joint McCandlish fit's crossing (its shape holds)", clamp
    lower, upper = bracket(shape_free.ci, measured, b0, failed_from)
    crit = at_or_below(measured, shape_free.crossing, b0)
    source = "the shape-free crossing"
    if joint is not None:
        by_fit = at_or_below(measured, joint.best.crossing, b0)
        which = "shape-free" if crit >= by_fit else "joint fit's"
        crit = max(crit, by_fit)
        source = (
            f"the larger of the shape-free and the joint fit's crossings, here the {which} (the "
            f"McCandlish shape is rejected: dAIC(mcc-pow) {joint.delta_aic:+.1f} > {SHAPE_REJECTED:g})"
        )
    top = measured[measured < upper] if upper is not None else measured
    crit = min(max(crit, lower), float(top.max(initial=lower)))  # inside the quoted interval's bracket
    crit, lower, upper, clamp = respect_verdicts(ascending, measured, crit, lower, upper, b0)
    return crit, lower, upper, source, clamp
