"""`batchtune check`: decide whether a trainer config sits where the measurements say it should.

Pure: numbers and analysis results in, small frozen verdicts out. Four checks (docs/method.md §3-§5):

- batch: N = P*G responses per step against the critical training batch and its interval. Above the
  interval's upper end, each doubling needs clearly more samples (R(B)/R(B0) > 1 + tol): fail. Inside:
  pass. Below the critical batch the samples needed are about the same (the curves overlay), so the
  loss is throughput: warn when Θ(B_crit)/Θ(N) exceeds 1 + waste tolerance (same R, that much longer).
- lr: the configured LR against the probe's rule from its reference, lr_rule(N) = scaled_lr(lr0, N,
  N0, rule) (sqrt for Adam: Malladi et al. 2022; linear for SGD: Goyal et al. 2017); fail when the
  ratio leaves [1/(1+tol), 1+tol].
- generation_concurrency: against the critical generation batch (the knee of the measured
  throughput curve): warn below it (one more doubling still pays), fail above the out-of-memory
  ceiling.
- time_to_target: predicted T(N) = R(N)/Θ(N), log-log interpolated between measured candidates,
  against a stored baseline: fail when T/T_base > 1 + tol.

Status per check: pass | warn | fail | skipped (nothing to check against) | insufficient (the
evidence cannot decide: exit 3, saying which).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchtune.analysis.critical import CriticalBatch
from batchtune.analysis.lr import scaled_lr
from batchtune.analysis.ratio import DEVIATES
from batchtune.analysis.throughput import Knee

PASS, WARN, FAIL, SKIPPED, INSUFFICIENT = "pass", "warn", "fail", "skipped", "insufficient"
EXIT_CODES = {FAIL: 1, INSUFFICIENT: 3}


@dataclass(frozen=True)
class CheckTolerances:
    """How far a config may stray before a check warns or fails (dimensionless ratios)."""

    lr: float = 0.25  # fail when lr / lr_rule leaves [1/1.25, 1.25]
    waste: float = 0.2  # warn when Θ(B_crit)/Θ(N) > 1.2 below the critical batch
    time: float = 0.1  # fail when T(N)/T_baseline > 1.1


@dataclass(frozen=True)
class CheckItem:
    """One check's verdict. ``role`` names the config setting it is about (for annotations)."""

    name: str
    status: str
    configured: str
    expected: str
    message: str
    role: str


@dataclass(frozen=True)
class CheckResult:
    items: tuple[CheckItem, ...]
    predicted_time: float | None  # T(N) in ``time_unit``; None when it cannot be predicted
    time_unit: str  # "s", or "x reference" when only throughput ratios are known
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        """1 if any check failed, else 3 if any lacked evidence, else 0 (warnings pass)."""
        statuses = {i.status for i in self.items}
        return 1 if FAIL in statuses else (3 if INSUFFICIENT in statuses else 0)

    @property
    def status(self) -> str:
        statuses = {i.status for i in self.items}
        for s in (FAIL, INSUFFICIENT, WARN):
            if s in statuses:
                return s
        return PASS


def _g(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "inf" if math.isinf(x) else f"{x:g}"


def interp_loglog(x: float, xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """y at x, linear in log-log between the measured neighbours; exact at a measured x; None
    outside [min xs, max xs] or when a neighbour is not finite and positive (never extrapolates)."""
    xa, ya = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if xa.size == 0 or x < xa.min() or x > xa.max():
        return None
    order = np.argsort(xa)
    xa, ya = xa[order], ya[order]
    hit = np.flatnonzero(xa == x)
    if hit.size:
        return float(ya[hit[0]])
    j = int(np.searchsorted(xa, x))
    y0, y1 = ya[j - 1], ya[j]
    if not (np.isfinite(y0) and np.isfinite(y1) and y0 > 0 and y1 > 0):
        return None
    t = math.log(x / xa[j - 1]) / math.log(xa[j] / xa[j - 1])
    return float(math.exp(math.log(y0) + t * math.log(y1 / y0)))


def check_batch(
    n: float,
    critical: CriticalBatch | None,
    batches: Sequence[float],
    responses_per_s: Sequence[float],
    waste_tol: float,
) -> CheckItem:
    """N against the critical training batch: fail above its interval, warn below it when the
    throughput given up is more than ``waste_tol`` (see the module docstring)."""

    def item(status: str, expected: str, message: str) -> CheckItem:
        return CheckItem("batch", status, f"{n:g} responses", expected, message, "batch")

    if critical is None or critical.batch is None:
        why = critical.reason if critical is not None else "the results have no critical-batch estimate"
        return item(INSUFFICIENT, "-", f"no critical training batch: {why}")
    crit = critical.batch
    lo = critical.crossing_ci[0] if critical.crossing_ci else critical.lower
    hi = critical.crossing_ci[1] if critical.crossing_ci else critical.upper
    hi = hi if hi is not None and math.isfinite(hi) else None
    interval = f"[{_g(lo)}, {_g(hi) if hi is not None else 'unbounded'}]"
    expected = f"<= {crit:g} (interval {interval})"
    # measured evidence bounds it too: the smallest batch that deviates, diverged or ran out of memory
    deviating = [v.batch for v in critical.verdicts if v.status == DEVIATES]
    stops = [x for x in (min(deviating, default=None), critical.failed_from) if x is not None]
    stop = min(stops, default=None)
    if (hi is not None and n > hi) or (stop is not None and n >= stop):
        bound = (
            f"its interval {interval}"
            if hi is not None and n > hi
            else f"the measured {stop:g}, which deviates"
        )
        return item(
            FAIL,
            expected,
            f"N = {n:g} responses per step is above the critical training batch {crit:g} and {bound}: "
            f"it needs clearly more samples to reach the target; use at most {crit:g}",
        )
    walk = critical.walk_batch
    if n > crit and hi is None and not (walk is not None and n <= walk):
        return item(
            INSUFFICIENT,
            expected,
            f"N = {n:g} is above the critical batch {crit:g} where no measurement decides (the interval is "
            "unbounded above and no measured batch tested invariant this high): probe batches around N",
        )
    if n > crit:
        where = (
            f"inside the interval {interval}"
            if hi is not None
            else f"at or below {walk:g}, which tested invariant"
        )
        return item(PASS, expected, f"N = {n:g} is above the point estimate {crit:g} but {where}")
    if n == crit:
        return item(PASS, expected, f"N = {n:g} is the critical training batch")
    thr_n = interp_loglog(n, batches, responses_per_s)
    thr_c = interp_loglog(crit, batches, responses_per_s)
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
    floor = lo if lo is not None else crit
    if n < floor:
        return item(
            WARN,
            expected,
            f"N = {n:g} is below the critical batch's interval {interval} (throughput at N not measured): "
            f"a larger batch likely reaches the target sooner",
        )
    return item(PASS, expected, f"N = {n:g} is inside the critical batch's interval {interval}")


def check_lr(lr: float | None, n: float, ref_lr: float, ref_batch: float, rule: str, tol: float) -> CheckItem:
    """The configured LR against the rule's LR at N, scaled from the probe's reference."""
    shown = _g(lr)
    if lr is None:
        return CheckItem("lr", SKIPPED, "-", "-", "the config sets no learning rate", "lr")
    if not (math.isfinite(ref_lr) and ref_lr > 0):
        return CheckItem(
            "lr",
            INSUFFICIENT,
            shown,
            "-",
            "the probe's reference carries no learning rate (measurements without `lr`): "
            "no rule to compare with",
            "lr",
        )
    want = scaled_lr(ref_lr, n, ref_batch, rule)
    ratio = lr / want
    expected = f"{want:.3g} ({rule} rule from lr {ref_lr:.3g} at {ref_batch:g} responses)"
    if ratio > 1.0 + tol or ratio < 1.0 / (1.0 + tol):
        return CheckItem(
            "lr",
            FAIL,
            shown,
            expected,
            f"lr {lr:.3g} is {ratio:.2f}x the {rule} rule's {want:.3g} at N = {n:g} "
            f"(tolerance {1 / (1 + tol):.2f}-{1 + tol:.2f}x); set lr = {want:.3g}",
            "lr",
        )
    return CheckItem("lr", PASS, shown, expected, f"lr is {ratio:.2f}x the {rule} rule's {want:.3g}", "lr")


def check_concurrency(concurrency: int | None, knee: Knee | None) -> CheckItem:
    """Generation concurrency against the knee (warn below) and the out-of-memory ceiling (fail)."""
    name, role = "generation_concurrency", "generation_concurrency"
    if knee is None:
        return CheckItem(name, SKIPPED, _g(concurrency), "-", "no generation profile in the results", role)
    k = knee.concurrency
    expected = f">= {k:g}" + (f", < {knee.ceiling:g} (out of memory)" if knee.ceiling else "")
    if concurrency is None:
        return CheckItem(name, SKIPPED, "-", expected, "the config sets no generation concurrency", role)
    c = float(concurrency)
    if knee.ceiling is not None and c >= knee.ceiling:
        return CheckItem(
            name,
            FAIL,
            f"{c:g}",
            expected,
            f"{c:g} responses in flight ran out of memory in the profile (ceiling {knee.ceiling:g}); "
            f"use {k:g}, the critical generation batch",
            role,
        )
    if c < k:
        return CheckItem(
            name,
            WARN,
            f"{c:g}",
            expected,
            f"{c:g} is below the critical generation batch {k:g}: one more doubling still buys more than "
            f"{knee.threshold:.0%} throughput",
            role,
        )
    tail = "" if knee.saturated else " (throughput still rose at the largest measured point)"
    return CheckItem(
        name, PASS, f"{c:g}", expected, f"at or above the critical generation batch {k:g}{tail}", role
    )


def check_time(
    predicted: float | None,
    unit: str,
    baseline: float | None,
    baseline_unit: str | None,
    tol: float,
    why_unpredicted: str = "",
) -> CheckItem:
    """Predicted time-to-target against a stored baseline; fail when it regresses beyond ``tol``."""
    name, role = "time_to_target", "batch"
    shown = f"{predicted:.4g} {unit}" if predicted is not None else "-"
    if baseline is None:
        return CheckItem(name, SKIPPED, shown, "-", "no --baseline given", role)
    base = f"<= {baseline * (1 + tol):.4g} {baseline_unit} (baseline {baseline:.4g})"
    if predicted is None:
        return CheckItem(
            name, INSUFFICIENT, "-", base, f"time-to-target not predicted: {why_unpredicted}", role
        )
    if baseline_unit != unit:
        return CheckItem(
            name,
            INSUFFICIENT,
            shown,
            base,
            f"the baseline is in {baseline_unit!r}, this prediction in {unit!r}: regenerate the baseline",
            role,
        )
    ratio = predicted / baseline if baseline > 0 else math.inf
    if ratio > 1.0 + tol:
        return CheckItem(name, FAIL, shown, base, f"{ratio:.2f}x the baseline's time-to-target", role)
    return CheckItem(name, PASS, shown, base, f"{ratio:.2f}x the baseline's time-to-target", role)
