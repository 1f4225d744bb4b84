"""Benchmark: bias of the B_opt and B_min estimators on loss curves from a known law.

    python benchmarks/pretrain_recovery.py > benchmarks/out/pretrain_recovery.txt

The law is `batchtune.analysis.pretrain.synth.SynthLaw()` (defaults), whose B_min(L) and B_opt(L)
are exact. Part 1: noise-free steps-to-target on three grids (ratio 2^(1/4), 2^(1/2), 2): the bias
of each estimator. Part 2: noisy curves (1% multiplicative loss noise, 200 log-spaced logs per run,
budget 2e8 tokens), steps read off each curve by `samples_to_target` (isotonic), 3 paired seeds per
replicate, grid 2^(1/2), 5 replicates: bias per target and replicate, whether the 90% paired
bootstrap interval and the brackets (B_opt: the grid points either side of the measured minimum;
B_min: the batches that did and did not reach the target) contain the truth. Prints tables and one JSON line.
"""

# ruff: noqa: E501  (table layout)

from __future__ import annotations

import json
import time

import numpy as np

from batchtune.analysis.pretrain.batch import estimate_batches, plateaued
from batchtune.analysis.pretrain.synth import SynthLaw, synth_curves
from batchtune.analysis.sample.curves import samples_to_target

TARGETS = (2.9, 2.65, 2.45, 2.35)  # B_min off the grid points
LAW = SynthLaw()


def grid(ratio: float) -> np.ndarray:
    return 256.0 * ratio ** np.arange(int(round(np.log(512) / np.log(ratio))) + 1)


def _bias(value: float | None, truth: float) -> float:
    return float("nan") if value is None else value / truth - 1.0


def _inside(interval: tuple | None, truth: float) -> bool:
    return interval is not None and (interval[0] or 0.0) <= truth <= interval[1]


def noise_free() -> list[dict]:
    rows = []
    print("Part 1: noise-free steps to target (one seed)")
    print(
        f"{'grid':>8} {'L':>5} {'B_opt true':>11} {'bias':>7} {'source':>9} {'B_min true':>11} {'bias':>7} {'source':>9} bracket"
    )
    for ratio in (2**0.25, 2**0.5, 2.0):
        b = grid(ratio)
        for t in TARGETS:
            est = estimate_batches(b, LAW.steps_to(t, b)[None, :], t)
            bo, bm = _bias(est.b_opt_tokens, LAW.b_opt(t)), _bias(est.b_min_tokens, LAW.b_min(t))
            br = est.b_min_bracket
            print(f"{ratio:8.3f} {t:5.2f} {LAW.b_opt(t):11.0f} {bo:+7.3f} {est.b_opt_source:>9} "
                  f"{LAW.b_min(t):11.0f} {bm:+7.3f} {est.b_min_source:>9} {br[0]:.0f}..{br[1]:.0f} "
                  f"{'contains' if _inside(br, LAW.b_min(t)) else 'MISSES'}")  # fmt: skip
            rows.append({"grid_ratio": ratio, "target": t, "b_opt_bias": bo, "b_min_bias": bm,
                         "b_min_bracket_contains": _inside(br, LAW.b_min(t))})  # fmt: skip
    return rows


def noisy(replicates: int = 5, seeds_per_rep: int = 3, noise_rel: float = 0.01) -> list[dict]:
    b = grid(2**0.5)
    rows = []
    print(
        f"\nPart 2: noisy curves ({noise_rel:.0%} loss noise), {seeds_per_rep} paired seeds per replicate, grid 2^(1/2)"
    )
    print(
        f"{'L':>5} {'rep':>4} {'B_opt':>8} {'bias':>7} {'in 90% CI':>9} {'in bracket':>10} {'B_min':>8} {'bias':>7} {'in CI':>6} {'in bracket':>10}"
    )
    for rep in range(replicates):
        seeds = list(range(rep * seeds_per_rep, (rep + 1) * seeds_per_rep))
        runs = synth_curves(LAW, b, seeds, max_tokens=2e8, noise_rel=noise_rel)
        for t in TARGETS:
            steps = np.full((seeds_per_rep, b.size), np.inf)
            flat = np.zeros((seeds_per_rep, b.size), dtype=bool)
            for batch, seed, tokens, loss in runs:
                i, j = seeds.index(seed), int(np.flatnonzero(b == batch)[0])
                c = samples_to_target(tokens, loss, t, higher_is_better=False)
                if c.censored:
                    flat[i, j] = plateaued(tokens, loss, t)
                else:
                    steps[i, j] = c.samples_to_target / batch
            est = estimate_batches(b, steps, t, rng_seed=rep, plateaued_per_seed=flat)
            bo, bm = _bias(est.b_opt_tokens, LAW.b_opt(t)), _bias(est.b_min_tokens, LAW.b_min(t))
            row = {"target": t, "replicate": rep, "b_opt_bias": bo, "b_min_bias": bm,
                   "b_opt_ci_contains": _inside(est.b_opt_ci, LAW.b_opt(t)),
                   "b_opt_bracket_contains": _inside(est.b_opt_bracket, LAW.b_opt(t)),
                   "b_min_ci_contains": _inside(est.b_min_ci, LAW.b_min(t)),
                   "b_min_bracket_contains": _inside(est.b_min_bracket, LAW.b_min(t))}  # fmt: skip
            rows.append(row)
            print(f"{t:5.2f} {rep:4d} {est.b_opt_tokens or float('nan'):8.0f} {bo:+7.3f} {str(row['b_opt_ci_contains']):>9} "
                  f"{str(row['b_opt_bracket_contains']):>10} "
                  f"{est.b_min_tokens or float('nan'):8.0f} {bm:+7.3f} {str(row['b_min_ci_contains']):>6} "
                  f"{str(row['b_min_bracket_contains']):>10}")  # fmt: skip
    return rows


def main() -> None:
    t0 = time.perf_counter()
    clean = noise_free()
    rows = noisy()
    bo = np.array([r["b_opt_bias"] for r in rows])
    bm = np.array([r["b_min_bias"] for r in rows])
    summary = {
        "noise_free_max_abs_b_opt_bias_grid_sqrt2": max(abs(r["b_opt_bias"]) for r in clean if abs(r["grid_ratio"] - 2**0.5) < 1e-9),
        "noise_free_max_abs_b_min_bias_grid_sqrt2": max(abs(r["b_min_bias"]) for r in clean if abs(r["grid_ratio"] - 2**0.5) < 1e-9),
        "noisy_median_abs_b_opt_bias": float(np.nanmedian(np.abs(bo))),
        "noisy_max_abs_b_opt_bias": float(np.nanmax(np.abs(bo))),
        "noisy_median_abs_b_min_bias": float(np.nanmedian(np.abs(bm))),
        "noisy_max_abs_b_min_bias": float(np.nanmax(np.abs(bm))),
        "noisy_b_min_bracket_contains_frac": float(np.mean([r["b_min_bracket_contains"] for r in rows])),
        "noisy_b_opt_ci_contains_frac": float(np.mean([r["b_opt_ci_contains"] for r in rows])),
        "noisy_b_min_ci_contains_frac": float(np.mean([r["b_min_ci_contains"] for r in rows])),
        "noisy_b_opt_bracket_contains_frac": float(np.mean([r["b_opt_bracket_contains"] for r in rows])),
        "wall_s": round(time.perf_counter() - t0, 2),
    }  # fmt: skip
    print("\n" + json.dumps(summary))


if __name__ == "__main__":
    main()
