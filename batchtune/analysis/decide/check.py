"""`batchtune check`: decide whether a trainer config sits where the measurements say it should.

Pure: numbers and analysis results in, small frozen verdicts out. Four checks (docs/method.md §3-§5);
the verdict types and three of them live here, the batch check in `batch_check.py`:

- batch: N = P*G responses per step against the recommendation's own time-to-target ranking (the
  same analysis `recommend` ranks by, so a config `recommend --emit` wrote passes): pass for the
  pick, a batch within its uncertainty, or one whose predicted T(N) is within 1 + waste tolerance of
  the pick's; slower than that, fail when N also needs clearly more samples than the critical
  training batch (above the 1+tol crossing's interval, or at a measured batch that deviates), else
  warn. A batch above the critical batch is not wrong by itself: it wins when its throughput pays
  for its samples. Fail at or above a batch that diverged, ran out of memory or never reached the
  target. Where no T(N) is predicted (N beyond the measured batches), the samples decide: fail above
  the crossing's interval; below the critical batch the samples needed are about the same (the
  curves overlay), so warn when Θ(B_crit)/Θ(N) exceeds 1 + waste tolerance.
- lr: the configured LR against the probe's rule from its reference, lr_rule(N) = scaled_lr(lr0, N,
  N0, rule) (sqrt for Adam: Malladi et al. 2022; linear for SGD: Goyal et al. 2017); fail when the
  ratio leaves [1/(1+tol), 1+tol].
- generation_concurrency: against the critical generation batch (the knee of the measured
  throughput curve), capped at N (a step cannot have more responses in flight than it has): warn
  below that, fail at or above the out-of-memory ceiling.
- time_to_target: predicted T(N) = R(N)/Θ(N), log-log interpolated between measured candidates,
  against a stored baseline: fail when T/T_base > 1 + tol.

Status per check: pass | warn | fail | skipped (nothing to check against) | insufficient (the
evidence cannot decide: exit 3, saying which).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batchtune.analysis.sample.lr import scaled_lr
from batchtune.analysis.system.knee import Knee

PASS, WARN, FAIL, SKIPPED, INSUFFICIENT = "pass", "warn", "fail", "skipped", "insufficient"
EXIT_CODES = {FAIL: 1, INSUFFICIENT: 3}


@dataclass(frozen=True)
class CheckTolerances:
    """How far a config may stray before a check warns or fails (dimensionless ratios)."""

    lr: float = 0.25  # fail when lr / lr_rule leaves [1/1.25, 1.25]
    waste: float = 0.2  # flag T(N)/T(pick) > 1.2 (Θ(B_crit)/Θ(N) below the critical batch, no T)
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
    target: dict[str, Any] | None = None  # {metric, target, higher_is_better} the time is to

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


def g_text(x: float | None) -> str:
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


def check_lr(lr: float | None, n: float, ref_lr: float, ref_batch: float, rule: str, tol: float) -> CheckItem:
    """The configured LR against the rule's LR at N, scaled from the probe's reference."""
    shown = g_text(lr)
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


def check_concurrency(
    concurrency: int | None,
    knee: Knee | None,
    batch: float | None = None,
    engines: int = 1,
    streamed: bool = False,
) -> CheckItem:
    """Generation concurrency (per engine, as the profile measures it) against the knee (warn
    below) and the out-of-memory ceiling (fail).

    A step of ``batch`` responses cannot have more than ``batch`` in flight, so the knee is capped
    there: every response of the step decoding at once is as far as the step can go (it is also what
    ``recommend`` emits, ``min(N, largest measured concurrency)``). Over ``engines`` engines each
    gets a share of the step, which the message says (fewer engines, or a larger batch, fill them).
    A trainer that streams prompts (``streamed``: verl fully_async) has no step's batch: ``batch`` is
    then what its rollouter keeps in flight (more of it in flight, not a larger batch, fills them)."""
    name, role = "generation_concurrency", "generation_concurrency"
    if knee is None:
        return CheckItem(
            name, SKIPPED, g_text(concurrency), "-", "no generation profile in the results", role
        )
    k = knee.concurrency
    if batch is not None and batch > 0 and engines > 1:  # each engine gets its share of the step:
        batch = float(math.ceil(batch / engines))  # all of it in flight is as far as that engine goes
    want = min(k, batch) if batch is not None and batch > 0 else k
    capped = want < k
    step = "what the rollouter keeps in flight" if streamed else "a step"
    of_step = f"an engine's share of {step} ({engines} engines)" if engines > 1 else step
    expected = f">= {want:g}" + (f" (the {batch:g} responses of {of_step}; knee {k:g})" if capped else "")
    expected += f", < {knee.ceiling:g} (out of memory)" if knee.ceiling else ""
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
            f"use {want:g}"
            + (f", every response of {step}" if capped else ", the critical generation batch"),
            role,
        )
    if c < want:
        why = (
            f"the critical generation batch {k:g}, the smallest measured concurrency beyond which no "
            f"doubling bought {knee.threshold:.0%} more throughput"
        )
        if capped:
            why = f"the {batch:g} responses of {of_step} (below {why})"
        split = ""
        return CheckItem(
            name,
            WARN,
            f"{c:g}",
            expected,
            f"{c:g} responses in flight{' per engine' if engines > 1 else ''} is below {why}{split}",
            role,
        )
    if capped:
        msg = (
            f"every response of {of_step} ({batch:g}) can be in flight; the critical generation "
            f"batch {k:g} is beyond it"
            + (
                f": fewer engines or {'more in flight' if streamed else 'a larger batch'} would fill them"
                if engines > 1
                else ""
            )
        )
    else:
        tail = "" if knee.saturated else " (throughput still rose at the largest measured point)"
        msg = f"at or above the critical generation batch {k:g}{tail}"
    return CheckItem(name, PASS, f"{c:g}", expected, msg, role)


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
