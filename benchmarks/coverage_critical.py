"""Ground truth for the critical batch: synthetic R(B) of known B_crit, estimated as the tool does.

Each case: a true B_crit (responses) and a group size G; the grid is P = 4, 8, ..., 256 prompts,
so N = P G responses, doubling. Samples-to-target follows McCandlish et al. 2018 exactly,
R(B) = E_min (1 + B / B_crit), times a per-seed factor shared by every batch of that seed
(seeds are paired: log-normal, `--seed-spread`, 15% by default) and an independent per-run
factor (`--run-noise`, 6%: the spread of one run's R around its seed's curve). 3 seeds a batch.
Every repetition goes through `critical.critical_batch` (verdicts, joint fit, profile interval).

Per case: the true critical batch (the largest grid batch whose true R(B)/R(B0) <= 1 + tol) vs
the estimate (exact, within one grid step), the joint fit's crossing alone (`fit exact`: the
estimate before 2026-12-03) and the former verdict walk; the joint McCandlish
B_crit vs the truth (median ratio, share within 15%); the coverage of the 90% intervals of the
1+tol crossing and of B_crit. Prints a table and one JSON line. Usage:
    python benchmarks/coverage_critical.py [--reps 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass

import numpy as np

from batchtune.analysis.sample.critical import critical_batch
from batchtune.analysis.sample.curves import TargetCrossing
from batchtune.analysis.sample.seeds import estimate_over_seeds

B_CRITS = (64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0)
GROUP_SIZES = (8, 16)
PROMPTS = 4 * 2 ** np.arange(7)
E_MIN, TOL, CONFIDENCE, N_SEEDS = 2000.0, 0.1, 0.9, 3


@dataclass(frozen=True)
class CaseResult:
    b_crit: float
    group_size: int
    true_critical: float
    exact: float  # share of repetitions with the estimated critical batch == the truth
    within_one_step: float
    walk_exact: float  # the former walk's answer == the truth
    fit_exact: (
        float  # the joint fit's crossing alone (CriticalBatch.model_batch, the estimate before 2026-12-03)
    )
    b_crit_median_ratio: float
    b_crit_within_15pct: float
    crossing_coverage: float
    b_crit_coverage: float
    power_chosen: float


def simulate_case(
    b_crit: float,
    group_size: int,
    reps: int,
    rng: np.random.Generator,
    seed_spread: float = 0.15,
    run_noise: float = 0.06,
) -> CaseResult:
    batches = PROMPTS * float(group_size)
    b0 = float(batches[0])
    true_ratio = (1 + batches / b_crit) / (1 + b0 / b_crit)
    true_critical = float(batches[true_ratio <= 1 + TOL].max())
    true_crossing = b0 * (1 + TOL) + TOL * b_crit
    rows = []
    for _ in range(reps):
        seed_effect = rng.normal(0.0, seed_spread, N_SEEDS)
        r = E_MIN * (1 + batches[:, None] / b_crit) * np.exp(seed_effect[None, :])
        r = r * np.exp(rng.normal(0.0, run_noise, r.shape))
        ests = [
            estimate_over_seeds(
                [TargetCrossing(float(v), False, 1e12) for v in row],
                seed_ids=range(N_SEEDS),
                n_boot=200,
            )
            for row in r
        ]
        cb = critical_batch(batches, ests, tol=TOL, confidence=CONFIDENCE)
        assert cb.joint is not None and cb.crossing_ci is not None and cb.batch is not None
        m = cb.joint.mccandlish
        rows.append(
            (
                cb.batch == true_critical,
                abs(math.log2(cb.batch) - math.log2(true_critical)) <= 1.0 + 1e-9,
                cb.walk_batch == true_critical,
                (cb.model_batch if cb.model_batch is not None else cb.batch) == true_critical,
                m.b_crit / b_crit,
                cb.crossing_ci[0] <= true_crossing <= cb.crossing_ci[1],
                m.b_crit_ci[0] <= b_crit <= m.b_crit_ci[1],
                cb.joint.chosen == "power",
            )
        )
    a = np.array(rows, dtype=float)
    return CaseResult(
        b_crit=b_crit,
        group_size=group_size,
        true_critical=true_critical,
        exact=float(a[:, 0].mean()),
        within_one_step=float(a[:, 1].mean()),
        walk_exact=float(a[:, 2].mean()),
        fit_exact=float(a[:, 3].mean()),
        b_crit_median_ratio=float(np.median(a[:, 4])),
        b_crit_within_15pct=float(np.mean(np.abs(a[:, 4] - 1) <= 0.15)),
        crossing_coverage=float(a[:, 5].mean()),
        b_crit_coverage=float(a[:, 6].mean()),
        power_chosen=float(a[:, 7].mean()),
    )


def run_all(reps: int, seed: int, b_crits=B_CRITS, group_sizes=GROUP_SIZES) -> list[CaseResult]:
    rng = np.random.default_rng(seed)
    return [simulate_case(bc, g, reps, rng) for g in group_sizes for bc in b_crits]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    res = run_all(args.reps, args.seed)
    wall = time.perf_counter() - t0
    print(
        f"{args.reps} repetitions a case; 3 paired seeds, 15% seed spread, 6% run noise, tol {TOL}, "
        f"{100 * CONFIDENCE:.0f}% intervals"
    )
    print(
        f"{'G':>3} {'B_crit':>7} {'true crit':>9} {'exact':>6} {'<=1 step':>8} {'fit exact':>9} "
        f"{'walk exact':>10} "
        f"{'Bc_hat/Bc':>9} {'Bc in 15%':>9} {'cover X':>8} {'cover Bc':>8} {'power':>6}"
    )
    for c in res:
        print(
            f"{c.group_size:>3} {c.b_crit:>7.0f} {c.true_critical:>9.0f} {c.exact:>6.2f} "
            f"{c.within_one_step:>8.2f} {c.fit_exact:>9.2f} {c.walk_exact:>10.2f} "
            f"{c.b_crit_median_ratio:>9.3f} "
            f"{c.b_crit_within_15pct:>9.2f} {c.crossing_coverage:>8.2f} {c.b_crit_coverage:>8.2f} "
            f"{c.power_chosen:>6.2f}"
        )
    print(
        json.dumps(
            {
                "benchmark": "coverage_critical",
                "reps": args.reps,
                "seed": args.seed,
                "cases": len(res),
                "min_within_one_step": min(c.within_one_step for c in res),
                "mean_exact": round(float(np.mean([c.exact for c in res])), 3),
                "mean_fit_exact": round(float(np.mean([c.fit_exact for c in res])), 3),
                "mean_walk_exact": round(float(np.mean([c.walk_exact for c in res])), 3),
                "max_abs_log_b_crit_median_ratio": round(
                    max(abs(math.log(c.b_crit_median_ratio)) for c in res), 4
                ),
                "crossing_coverage_range": [
                    min(c.crossing_coverage for c in res),
                    max(c.crossing_coverage for c in res),
                ],
                "b_crit_coverage_range": [
                    min(c.b_crit_coverage for c in res),
                    max(c.b_crit_coverage for c in res),
                ],
                "wall_s": round(wall, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
