"""When a probe run stops (docs/method.md §3): at a confirmed target, past the reference band, at
the sample budget, or at a non-finite value. Pure functions of what the run has shown so far.

The band is ``band_factor * (1 + tol) * R_ref`` samples (R_ref at its upper CI, which settles the
verdict "deviates"), and the same factor times ``R_ref / Θ_ref`` seconds of the run's own step
times (Θ_ref from the reference's step times: a batch needing more samples can still win on time);
a run stops outside the band only past both. 0 s without step times: the samples band alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from batchtune.analysis.sample.curves import confirmed_crossing
from batchtune.analysis.sample.efficiency import SampleEfficiency
from batchtune.recipe.schema import Recipe
from batchtune.records.types import StepRecord

NO_BAND = (math.inf, math.inf)  # (samples, seconds): no reference band (yet)


@dataclass(frozen=True)
class StopPolicy:
    metric: str
    target: float
    higher_is_better: bool
    ema_alpha: float
    max_samples: int
    stop_at_target: bool
    band_samples: float  # stop when past this many samples without reaching the target; inf = never
    origin_samples: int = 0  # branched probes: the target is judged on samples counted from here
    # ...and past this many seconds of its own step times (0: the sample band alone, no timings)
    band_time_s: float = 0.0
    other_s_per_step: float = 0.0  # the recipe's per-step overhead, as the ranking adds it


def stop_policy(recipe: Recipe, band: tuple[float, float]) -> StopPolicy:
    """The recipe's stop policy with the reference band ``band`` (samples, seconds)."""
    t = recipe.target
    return StopPolicy(
        metric=t.metric,
        target=t.value,
        higher_is_better=t.higher_is_better,
        ema_alpha=t.ema_alpha,
        max_samples=recipe.budget.max_samples,
        stop_at_target=recipe.budget.stop_at_target,
        band_samples=band[0] if recipe.budget.stop_outside_band else math.inf,
        band_time_s=band[1],
        other_s_per_step=recipe.generation.other_s_per_step,
    )


def band_of(eff: SampleEfficiency, reference: str, recipe: Recipe) -> tuple[float, float]:
    """The reference band (module docstring) from an analysis of the probe; NO_BAND where the
    reference has no finite estimate."""
    try:
        cand = eff.get(reference)
    except KeyError:
        return NO_BAND
    est = cand.estimate
    if est is None or not math.isfinite(est.ci_high):
        return NO_BAND
    factor = recipe.budget.band_factor * (1 + recipe.target.tolerance)
    step_s = cand.gen_s_per_step + cand.train_s_per_step
    step_s += recipe.generation.other_s_per_step if step_s > 0 else 0.0
    return factor * est.ci_high, factor * est.ci_high / cand.batch_responses * step_s


@dataclass
class RunCurve:
    """What a run has shown so far: its target metric against samples (counted from the policy's
    origin), whether a raw point reached the target, its time totals and its last step."""

    samples: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    reached: bool = False  # the fit cannot reach the target before a raw point does
    totals: dict[str, float] = field(default_factory=lambda: {"gen_s": 0.0, "train_s": 0.0, "other_s": 0.0})
    last: StepRecord | None = None

    def add(self, step: StepRecord, policy: StopPolicy) -> None:
        self.last = step
        for key in self.totals:
            self.totals[key] += getattr(step, key)
        value = step.metrics.get(policy.metric)
        if value is not None:
            self.samples.append(step.samples - policy.origin_samples)
            self.values.append(value)
            hit = value >= policy.target if policy.higher_is_better else value <= policy.target
            self.reached = self.reached or hit


def stop_reason(policy: StopPolicy, curve: RunCurve, step: StepRecord, unit: str) -> tuple[str, str] | None:
    """(status, reason) if the run stops after ``step`` (already added to ``curve``), else None."""
    bad = [k for k, v in step.metrics.items() if not math.isfinite(v)]
    if step.grad_norm is not None and not math.isfinite(step.grad_norm):
        bad.append("grad_norm")
    if bad:
        return "diverged", f"{', '.join(bad)} not finite at step {step.step}"
    if policy.stop_at_target and curve.reached and step.metrics.get(policy.metric) is not None:
        # 25% past R (target_confirmed): no end-of-curve bias
        crossing = confirmed_crossing(
            curve.samples, curve.values, policy.target, higher_is_better=policy.higher_is_better
        )
        if crossing is not None:
            return "reached_target", f"reached the target at {crossing.samples_to_target:.0f} {unit}"
    train_time_s = curve.totals["gen_s"] + curve.totals["train_s"] + step.step * policy.other_s_per_step
    if step.samples >= policy.band_samples and train_time_s >= policy.band_time_s:
        band = f"{policy.band_samples:.0f}"
        return (
            "stopped_outside_band",
            f"no target after {step.samples} samples, past the reference band ({band})",
        )
    if step.samples >= policy.max_samples:
        return "budget_exhausted", budget_reason(policy, unit)
    return None


def budget_reason(policy: StopPolicy, unit: str) -> str:
    return f"spent the budget of {policy.max_samples} {unit}"
