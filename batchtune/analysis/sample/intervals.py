"""What an interval is, in words, and intervals that do not lean on one model of R(B).

`interval_kind` names a samples-to-target interval for a report. The bootstrap percentile
interval of the median over up to 7 seeds is the seeds' [min, max]: for the median of R it is a
75% interval with 3 seeds (1 - 2 / 2^3), and one new run (the full run a user makes next) falls
inside it with probability (n - 1) / (n + 1), 50% with 3 seeds. So it is named "range of N seeds"
and never "90%".
"""

from __future__ import annotations

from batchtune.analysis.sample.curves import MEDIAN, TargetEstimate


def interval_kind(est: TargetEstimate, scale_ci: tuple[float, float] = (1.0, 1.0)) -> str:
    """What (ci_low, ci_high) of ``est`` is (times ``scale_ci``: a branched trunk's extrapolation)."""
    if est.no_interval:
        kind = "one seed, no interval"
    else:
        vals = est.seed_values()
        rng = (float(vals.min()), float(vals.max()))
        if est.statistic == MEDIAN and (est.ci_low, est.ci_high) == rng:
            kind = f"range of {est.n_seeds} seeds"
        else:
            kind = f"{est.confidence:.0%} bootstrap interval over {est.n_seeds} seeds"
    return kind if tuple(scale_ci) == (1.0, 1.0) else f"{kind} x the trunk's extrapolation interval"


def ci_header(estimates: list[TargetEstimate | None]) -> str:
    """A table's column head for the R intervals: "seed range" when every one is its seeds'
    [min, max] (3 seeds: not a 90% interval), else "interval"."""
    kinds = {interval_kind(e) for e in estimates if e is not None and not e.no_interval}
    return "seed range" if kinds and all(k.startswith("range of") for k in kinds) else "interval"
