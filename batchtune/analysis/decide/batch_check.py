"""`batchtune check`'s batch check: N = P*G against the time-to-target ranking and the critical batch.

The rule is in check.py's module docstring. Three parts: what the critical batch's evidence says
about N (`_gate`), the verdict when the ranking predicts a time-to-target at N (`_by_time`), and
the verdict when it does not, so the samples decide (`_by_samples`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batchtune.analysis.decide.check import (
    FAIL,
    INSUFFICIENT,
    PASS,
    WARN,
    CheckItem,
    g_text,
    interp_loglog,
)
from batchtune.analysis.sample.critical import CriticalBatch
from batchtune.analysis.sample.ratio import DEVIATES

_Item = Callable[[str, str, str], CheckItem]


def _num(x: float | None) -> str:
    """A fitted number for a message: 3 significant digits, whole numbers from 100 up."""
    if x is None or math.isnan(x):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _interval_label(critical: CriticalBatch) -> str:
    """What the gate's interval is: the 1+tol crossing's quoted one (CriticalBatch.quoted_crossing:
    the shape-free one, calibrated on McCandlish and NQM curves alike, else the joint fit's), or
    the measured bracket."""
    quoted = critical.quoted_crossing
    if quoted is None:
        return "the measured bracket"
    if critical.shape_free is not None:
        return f"the 1+tol crossing's {quoted[2]}"
    conf = f"{100 * critical.joint.confidence:.0f}% " if critical.joint is not None else ""
    return f"the joint fit's {conf}interval of the 1+tol crossing"


def _critical_text(critical: CriticalBatch) -> str:
    """The critical batch with the interval it comes with, each labelled as what it is: the batch is
    a measured one, the interval belongs to the 1+tol crossing (or is the measured bracket)."""
    text = f"critical batch {g_text(critical.batch)}"
    quoted = critical.quoted_crossing
    if quoted is not None:
        cross, (c_lo, c_hi), kind = quoted
        where = f" {_num(cross)}" if math.isfinite(cross) else ""
        return f"{text} (the 1+tol crossing{where}, {kind} [{_num(c_lo)}, {_num(c_hi)}])"
    lo, hi = critical.lower, critical.upper
    if lo is None and hi is None:
        return text
    return f"{text} (measured bracket [{g_text(lo)}, {g_text(hi) if hi is not None else 'unbounded'}])"


@dataclass(frozen=True)
class TimeRanking:
    """The recommendation's time-to-target ranking as ``check_batch`` reads it (one analysis for both).

    ``batches``/``times``: the measured batches, ascending, and their predicted time-to-target in
    ``unit`` ("s", or "x reference"; inf where the batch never reached the target). ``pick_*``: the
    recommended candidate. ``tied``: the batches of the candidates the ranking calls within
    uncertainty of the pick (``ranking.within_uncertainty``).
    """

    batches: tuple[float, ...]
    times: tuple[float, ...]
    unit: str
    pick_name: str
    pick_batch: float
    pick_time: float
    tied: tuple[float, ...] = ()

    def show(self, t: float) -> str:
        return f"{t:.3g} s" if self.unit == "s" else f"{t:.3g}x the reference's"

    def is_tied(self, n: float) -> bool:
        """N is the pick, a batch within its uncertainty, or between two such measured batches."""
        ok = {self.pick_batch, *self.tied}
        if n in ok:
            return n != self.pick_batch
        if n in self.batches:  # measured and ranked outside the pick's uncertainty: its own time decides
            return False
        below = [b for b in self.batches if b < n]
        above = [b for b in self.batches if b > n]
        return bool(below and above and max(below) in ok and min(above) in ok)


@dataclass(frozen=True)
class _Gate:
    """What the critical batch's evidence says about N: ``lo``/``hi`` the interval the gate reads
    (``hi`` None when unbounded), ``label`` what that interval is, ``more_samples`` why N needs
    clearly more samples ("" when nothing says so), ``failed_why`` the failed batch N is at or
    above ("" when none)."""

    crit: float
    about: str
    lo: float | None
    hi: float | None
    label: str
    more_samples: str
    failed_why: str

    @property
    def interval(self) -> str:
        return f"[{_num(self.lo)}, {_num(self.hi) if self.hi is not None else 'unbounded'}]"


def _gate(n: float, critical: CriticalBatch, crit: float) -> _Gate:
    """The interval the gate reads, and whether N is above it, at a deviating or a failed batch."""
    quoted = critical.quoted_crossing
    lo, hi = quoted[1] if quoted is not None else (critical.lower, critical.upper)
    hi = hi if hi is not None and math.isfinite(hi) else None
    label = _interval_label(critical)
    interval = f"[{_num(lo)}, {_num(hi) if hi is not None else 'unbounded'}]"
    # measured evidence bounds it too: the smallest batch that deviates, diverged or ran out of memory
    deviating = min((v.batch for v in critical.verdicts if v.status == DEVIATES), default=None)
    more_samples = ""
    if hi is not None and n > hi:
        more_samples = f"above {label} {interval}"
    elif deviating is not None and n >= deviating:
        more_samples = f"at or above the measured {deviating:g}, which deviates"
    failed = critical.failed_from
    failed_why = (
        f"at or above the measured {failed:g}, where every seed diverged, ran out of memory or never "
        "reached the target"
        if failed is not None and n >= failed
        else ""
    )
    return _Gate(crit, _critical_text(critical), lo, hi, label, more_samples, failed_why)


def _by_time(n: float, g: _Gate, ranking: TimeRanking, t: float, waste_tol: float, item: _Item) -> CheckItem:
    """Time-to-target decides, as it decides the recommendation (check_batch)."""
    pick = f"{ranking.pick_name} (N = {ranking.pick_batch:g}, {ranking.show(ranking.pick_time)})"
    expected = f"time-to-target <= {1 + waste_tol:.3g}x the pick {pick}, or within its uncertainty"
    ratio = t / ranking.pick_time
    chosen, tied = n == ranking.pick_batch, ranking.is_tied(n)
    if g.failed_why and not (chosen or tied):
        return item(FAIL, expected, f"N = {n:g} is {g.failed_why}; use {ranking.pick_batch:g}")
    if chosen or tied:
        what = (
            f"the recommendation's own pick, {ranking.pick_name}: the soonest expected time-to-target"
            if chosen
            else f"within uncertainty of the pick {pick}: {ratio:.2f}x its time-to-target"
        )
        msg = f"N = {n:g} is {what}"
        if n > g.crit:
            msg += f"; above the {g.about}, the extra samples it needs are paid for by its throughput"
        if g.failed_why:
            return item(WARN, expected, f"{msg}; but it is {g.failed_why}")
        return item(PASS, expected, msg)
    said = f"N = {n:g}: predicted time-to-target {ranking.show(t)}, {ratio:.2f}x the pick's"
    if ratio <= 1.0 + waste_tol:
        return item(PASS, expected, f"{said} (tolerance {1 + waste_tol:.2f}x)")
    if g.more_samples:
        return item(
            FAIL,
            expected,
            f"{said}, and it is {g.more_samples}: it needs clearly more samples than the critical "
            f"batch {g.crit:g}, more than its throughput pays for; use {ranking.pick_batch:g} "
            f"({ranking.pick_name})",
        )
    return item(WARN, expected, f"{said}: consider {ranking.pick_batch:g} ({ranking.pick_name})")


def _too_large(n: float, g: _Gate, ranking: TimeRanking | None, expected: str, item: _Item) -> CheckItem:
    """Fail, with no predicted time: N needs clearly more samples, or is at a failed batch."""
    if g.failed_why:
        bound = g.failed_why
    else:
        bound = f"{g.more_samples}: it needs clearly more samples than the critical batch {g.crit:g}"
    if ranking is not None:
        unpredicted = (
            f"beyond the measured batches {ranking.batches[0]:g}-{ranking.batches[-1]:g}"
            if ranking.batches and not ranking.batches[0] <= n <= ranking.batches[-1]
            else "next to a measured batch that never reached the target"
        )
        advice = (
            f"no time-to-target is predicted {unpredicted}; use {ranking.pick_batch:g} "
            f"({ranking.pick_name}), the recommendation's pick"
        )
    else:
        advice = f"use at most {g.crit:g}"
    return item(FAIL, expected, f"N = {n:g} responses per step is {bound}; {advice}")


def _by_samples(
    n: float,
    g: _Gate,
    critical: CriticalBatch,
    ranking: TimeRanking | None,
    throughput: tuple[Sequence[float], Sequence[float]],
    waste_tol: float,
    item: _Item,
) -> CheckItem:
    """No predicted time: the samples decide (check.py's module docstring)."""
    crit = g.crit
    expected = f"<= {crit:g}; {g.about}"
    if ranking is not None:
        expected = f"{g.about}; the pick {ranking.pick_name} (N = {ranking.pick_batch:g})"
    if g.more_samples or g.failed_why:
        return _too_large(n, g, ranking, expected, item)
    walk = critical.walk_batch
    if n > crit and g.hi is None and not (walk is not None and n <= walk):
        return item(
            INSUFFICIENT,
            expected,
            f"N = {n:g} is above the {g.about} where no measurement decides (the interval is "
            "unbounded above and no measured batch tested invariant this high): probe batches around N",
        )
    if n > crit:
        where = (
            f"inside {g.label} {g.interval}"
            if g.hi is not None
            else f"at or below {walk:g}, which tested invariant"
        )
        return item(PASS, expected, f"N = {n:g} is above the critical batch {crit:g} but {where}")
    if n == crit:
        return item(PASS, expected, f"N = {n:g} is the critical training batch")
    thr_n = interp_loglog(n, *throughput)
    thr_c = interp_loglog(crit, *throughput)
    if thr_n is not None and thr_c is not None:
        waste = thr_c / thr_n
        if waste > 1.0 + waste_tol:
            return item(
                WARN,
                expected,
                f"N = {n:g} is below the critical batch {crit:g}: about the same samples to target at "
                f"{waste:.2f}x less throughput (up to {(1 - 1 / waste):.0%} of the time wasted); "
                f"consider {crit:g}",
            )
        return item(
            PASS,
            expected,
            f"N = {n:g} is below the critical batch {crit:g}; throughput there is only {waste:.2f}x",
        )
    floor = g.lo if g.lo is not None else crit
    if n < floor:
        return item(
            WARN,
            expected,
            f"N = {n:g} is below {g.label} {g.interval} (throughput at N not measured): a larger batch "
            "likely reaches the target sooner",
        )
    return item(PASS, expected, f"N = {n:g} is inside {g.label} {g.interval}")


def check_batch(
    n: float,
    critical: CriticalBatch | None,
    batches: Sequence[float],
    responses_per_s: Sequence[float],
    waste_tol: float,
    ranking: TimeRanking | None = None,
) -> CheckItem:
    """N against the recommendation's time-to-target ranking and the critical training batch.

    With a ``ranking`` and N inside the measured batches, time-to-target decides, as it decides the
    recommendation: pass for the pick, a batch within its uncertainty, or one predicted within
    ``1 + waste_tol`` of its time; else fail when N also needs clearly more samples (above the
    crossing's interval, or at a measured batch that deviates), warn otherwise. A batch above the
    critical batch is not wrong by itself: the pick can be one, when its throughput pays for its
    samples. At or above a batch that diverged, ran out of memory or never reached the target:
    fail. Without a predicted time (N beyond the measured batches, a neighbour that never reached
    the target, no ranking) the samples decide (check.py's module docstring)."""

    def item(status: str, expected: str, message: str) -> CheckItem:
        return CheckItem("batch", status, f"{n:g} responses", expected, message, "batch")

    if critical is None or critical.batch is None:
        why = critical.reason if critical is not None else "the results have no critical-batch estimate"
        return item(INSUFFICIENT, "-", f"no critical training batch: {why}")
    g = _gate(n, critical, critical.batch)
    t = interp_loglog(n, ranking.batches, ranking.times) if ranking is not None else None
    if ranking is not None and t is not None and math.isfinite(t) and ranking.pick_time > 0:
        return _by_time(n, g, ranking, t, waste_tol, item)
    return _by_samples(n, g, critical, ranking, (batches, responses_per_s), waste_tol, item)
