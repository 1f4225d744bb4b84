"""JSON-ready dictionaries of the result objects (standard JSON: inf and NaN become strings)."""

from __future__ import annotations

import math
from typing import Any

from batchtune.analysis.efficiency import SampleEfficiency


def num(x: float | None) -> float | str | None:
    """A JSON number; NaN (unknown) becomes null and infinity (never reached) the string "inf"."""
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return None
    return x if math.isfinite(x) else str(x)


def efficiency_to_dict(eff: SampleEfficiency) -> dict[str, Any]:
    crit = eff.critical
    candidates = []
    for c in eff.candidates:
        est = c.estimate
        ratio = c.verdict.ratio if c.verdict else None
        candidates.append(
            {
                "name": c.label,
                "prompts": c.prompts,
                "group_size": c.group_size,
                "batch_responses": c.batch_responses,
                "lr": num(c.lr),
                "lr_rule": c.lr_rule,
                "family": c.family,
                "status": c.status,
                "status_reason": c.verdict.reason if c.verdict else "; ".join(c.failures),
                "samples_to_target": num(est.samples_to_target) if est else None,
                "samples_ci": [num(est.ci_low), num(est.ci_high)] if est else None,
                "sample_ratio": num(ratio.ratio) if ratio else (1.0 if c.label == eff.reference else None),
                "sample_ratio_ci": [num(ratio.ci_low), num(ratio.ci_high)] if ratio else None,
                "n_seeds": est.n_seeds if est else 0,
                "n_censored": est.n_censored if est else 0,
                "per_seed_samples_to_target": [num(v) for v in est.per_seed] if est else [],
                "failures": list(c.failures),
                "probe_samples": c.samples_consumed,
                "probe_wall_s": c.wall_s,
            }
        )
    return {
        "reference": eff.reference,
        "metric": eff.metric,
        "target": num(eff.target),
        "higher_is_better": eff.higher_is_better,
        "tolerance": eff.tolerance,
        "critical_training_batch": None
        if crit is None
        else {
            "batch_responses": num(crit.batch),
            "lower": num(crit.lower),
            "upper": num(crit.upper),
            "interpolated": num(crit.interpolated),
            "reason": crit.reason,
        },
        "gradient_noise": {
            "grad_norm_slope": num(eff.grad_slope.slope) if eff.grad_slope else None,
            "grad_norm_slope_ci": [num(v) for v in eff.grad_slope.slope_ci] if eff.grad_slope else None,
            "b_simple": num(eff.noise_scale.b_simple) if eff.noise_scale else None,
            "critic_grad_norm_slope": num(eff.critic_grad_slope.slope) if eff.critic_grad_slope else None,
        },
        "probe_cost": {"samples": eff.total_samples, "wall_s": eff.total_wall_s},
        "candidates": candidates,
        "notes": list(eff.notes),
    }
