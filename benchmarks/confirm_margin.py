"""The probe's stopping margin: bias of samples-to-target against the samples a run spends.

A probe run stops at the first logged point where its estimated R is confirmed, i.e. the run has
gone `margin` x R past it (`analysis.sample.curves.target_confirmed`). Stopping at the first such point
favours estimates that happen to dip early (optional stopping), so a small margin reads R low on
noisy curves; a large one spends more samples. This script measures both on the noisiest cells of
the recovery study (benchmarks/recovery_samples_to_target.py: high noise, one log every 4 steps,
the reference batch B0 = 8), on the same curves for every margin (paired), and prints one table and
one JSON line. Usage:
    python benchmarks/confirm_margin.py [--reps 2000] [--margins 0.2 0.25 0.3] \
        > benchmarks/out/confirm_margin.txt
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from recovery_samples_to_target import NOISE, SHAPES, noisy_curve, probe_stop

from batchtune.analysis.sample.curves import CONFIRM_MARGIN, samples_to_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--margins", nargs="+", type=float, default=[0.2, 0.25, 0.3])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    for shape in SHAPES:
        _, target, higher, _ = SHAPES[shape]
        rng = np.random.default_rng(args.seed)
        curves = [noisy_curve(shape, args.batch, NOISE["high"], 4, rng) for _ in range(args.reps)]
        for margin in args.margins:
            ratios, spent = [], []
            for s, m, r_true in curves:
                n = probe_stop(s, m, shape, margin)
                c = samples_to_target(s[:n], m[:n], target, higher_is_better=higher)
                if c.samples_to_target is not None:
                    ratios.append(c.samples_to_target / r_true)
                    spent.append(s[n - 1] / r_true)
            x = np.array(ratios)
            se = 1.2533 * float(np.std(x)) / math.sqrt(x.size)  # s.e. of a median, normal approximation
            bias = 100 * (float(np.median(x)) - 1)
            rows.append((shape, margin, bias, 100 * se, float(np.median(spent)), x.size))
    print(
        f"probe-stopped runs: high noise, one log every 4 steps, B = {args.batch}, {args.reps} curves "
        f"a shape, the same curves for every margin; shipped margin {CONFIRM_MARGIN}"
    )
    print(f"{'shape':9} {'margin':>6} {'bias %':>7} {'s.e.':>5} {'samples spent / R':>18} {'reached':>8}")
    for shape, margin, bias, se, median_spent, n in rows:
        print(f"{shape:9} {margin:6.2f} {bias:+7.2f} {se:5.2f} {median_spent:18.2f} {n:8d}")
    print(
        json.dumps(
            {
                "benchmark": "confirm_margin",
                "reps": args.reps,
                "batch": args.batch,
                "shipped_margin": CONFIRM_MARGIN,
                "rows": [
                    {
                        "shape": r[0],
                        "margin": r[1],
                        "bias_pct": round(r[2], 2),
                        "se_pct": round(r[3], 2),
                        "spent_over_r": round(r[4], 3),
                    }
                    for r in rows
                ],
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
