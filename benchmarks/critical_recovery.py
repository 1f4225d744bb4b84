"""The critical batch against the truth: the tool's rule, the shape-free crossing alone, the fit's alone.

Cases: benchmarks/coverage_shape_free.py's two families (synthetic McCandlish R(B), 6 B_crit x 2
group sizes; the NQM variants' exact expected-loss R(B), flat then steep), each measured as the
probe measures it: 3 paired seeds a batch (15% log-normal seed effect shared by every batch of a
seed, 6% per-run factor), the reference the smallest batch, tol 0.1. A batch whose true R is
infinite (it diverges) is passed as a failed batch. Every repetition goes through
`critical.critical_batch`, and four answers are read from the same data:
  tool    `batch` (analysis/sample/crossing_batch.read_batch): the McCandlish crossing where that
          shape holds (dAIC <= 2), else the larger of the shape-free and the fit's readings, inside
          the quoted (shape-free) interval's bracket and the per-batch verdicts;
  tool6   the same rule with the McCandlish shape rejected only from dAIC > 6 (where joint.py
          chooses the power law) instead of 2: the fit's answer up to 6, the tool's above;
  sf      the largest measured batch at or below the shape-free crossing alone, inside the verdicts;
  fit     `model_batch`: the same on the joint fit's own crossing (the estimate before 2026-12-03);
  walk    `walk_batch`: the verdict walk (a lower bound).
Truth: the largest grid batch whose true R(B)/R(B0) <= 1 + tol. Per case: the share of repetitions
each answer is exact and within one grid step (a doubling). Prints a table and one JSON line. Usage:
    python benchmarks/critical_recovery.py [--reps 40] [--seed 0] [--only nqm|synthetic]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from coverage_shape_free import (  # noqa: E402
    CONFIDENCE,
    N_SEEDS,
    RUN_NOISE,
    SEED_SPREAD,
    TOL,
    nqm_cases,
    synthetic_cases,
)

from batchtune.analysis.sample.critical import CriticalBatch, critical_batch  # noqa: E402
from batchtune.analysis.sample.crossing_batch import at_or_below, bracket, respect_verdicts  # noqa: E402
from batchtune.analysis.sample.curves import TargetCrossing  # noqa: E402
from batchtune.analysis.sample.seeds import estimate_over_seeds  # noqa: E402

ANSWERS = ("tool", "tool6", "sf", "fit", "walk")
FIT = ANSWERS.index("fit")


def _sf_alone(cb: CriticalBatch, b: np.ndarray, failed: float | None) -> float | None:
    """The shape-free crossing's batch alone, clamped by the verdicts as the tool clamps."""
    sf = cb.shape_free
    if sf is None:
        return cb.batch
    b0 = float(b[0])
    ascending = sorted(cb.verdicts, key=lambda v: v.batch)
    lower, upper = bracket(sf.ci, b, b0, failed)
    return respect_verdicts(ascending, b, at_or_below(b, sf.crossing, b0), lower, upper, b0)[0]


def simulate(batches: np.ndarray, true_r: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """(reps, answers) of log2(estimate / truth): 0 exact, +-1 one grid step off."""
    ok = np.isfinite(true_r)
    b = batches[ok]
    truth = float(b[true_r[ok] / true_r[ok][0] <= 1 + TOL].max())
    out = []
    for _ in range(reps):
        luck = rng.normal(0.0, SEED_SPREAD, N_SEEDS)
        r = true_r[ok][:, None] * np.exp(luck[None, :] + rng.normal(0.0, RUN_NOISE, (b.size, N_SEEDS)))
        ests = [
            estimate_over_seeds(
                [TargetCrossing(float(v), False, 1e12) for v in row], seed_ids=range(N_SEEDS), n_boot=200
            )
            for row in r
        ]
        cb = critical_batch(
            b, ests, tol=TOL, confidence=CONFIDENCE, seed=int(rng.integers(2**31)),
            failed_batches=[float(x) for x in batches[~ok]],
        )  # fmt: skip
        failed = float(batches[~ok].min()) if (~ok).any() else None
        fit = cb.model_batch if cb.model_batch is not None else cb.batch
        tool6 = fit if cb.joint is not None and not cb.joint.delta_aic > 6 else cb.batch
        got = (cb.batch, tool6, _sf_alone(cb, b, failed), fit, cb.walk_batch)
        out.append([math.log2(float(x) / truth) if x is not None else math.nan for x in got])
    return np.array(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("nqm", "synthetic"), default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        families = {"synthetic": synthetic_cases(), "nqm": nqm_cases(tmp)}
    if args.only:
        families = {args.only: families[args.only]}
    print(
        f"{args.reps} repetitions a case; {N_SEEDS} paired seeds, {100 * SEED_SPREAD:.0f}% seed spread, "
        f"{100 * RUN_NOISE:.0f}% run noise, tol {TOL}; tool = critical_batch's batch, tool6 = its rule from "
        "dAIC > 6, sf = the shape-free "
        "crossing alone, fit = the joint fit's crossing alone, walk = the verdict walk"
    )
    head = f"{'family':<10} {'case':<13} {'crit*':>6}"
    head += "".join(f" {a + ' exact':>10} {a + ' <=1':>8}" for a in ANSWERS)
    print(head)
    summary: dict[str, dict[str, object]] = {}
    for fam, cases in families.items():
        per_case, all_d = [], []
        for name, b, r, _ in cases:
            d = simulate(b, r, args.reps, rng)
            all_d.append(d)
            ok = np.isfinite(r)
            truth = float(b[ok][r[ok] / r[ok][0] <= 1 + TOL].max())
            exact, near = (d == 0).mean(axis=0), (np.abs(d) <= 1).mean(axis=0)
            per_case.append((exact, near))
            print(
                f"{fam:<10} {name:<13} {truth:>6.0f}"
                + "".join(f" {e:>10.2f} {n:>8.2f}" for e, n in zip(exact, near, strict=True))
            )
        ex = np.array([e for e, _ in per_case])
        nr = np.array([n for _, n in per_case])
        dd = np.vstack(all_d)
        lo, hi = dd < -1, dd > 1
        summary[fam] = {"cases": len(cases)}
        for k, a in enumerate(ANSWERS):
            summary[fam][a] = {
                "mean_exact": round(float(ex[:, k].mean()), 3),
                "min_exact": round(float(ex[:, k].min()), 3),
                "mean_within_one_step": round(float(nr[:, k].mean()), 3),
                "min_within_one_step": round(float(nr[:, k].min()), 3),
                "cases_more_exact_than_fit": int(np.sum(ex[:, k] > ex[:, FIT] + 1e-9)),
                "cases_less_exact_than_fit": int(np.sum(ex[:, k] < ex[:, FIT] - 1e-9)),
                "more_than_one_step_low": round(float(lo[:, k].mean()), 4),
                "more_than_one_step_high": round(float(hi[:, k].mean()), 4),
            }
    print(
        "crit*: the true critical batch on the grid; exact / <=1: share of repetitions equal to it / "
        "within one doubling"
    )
    print(json.dumps({"benchmark": "critical_recovery", "reps": args.reps, "seed": args.seed,
                      "summary": summary, "wall_s": round(time.perf_counter() - t0, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
