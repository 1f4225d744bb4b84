"""Coverage of the 1+tol crossing intervals when R(B) is, and is not, McCandlish's.

Two families of true R(B), each measured as the probe measures it: 3 paired seeds a batch (a
log-normal seed effect shared by every batch of a seed, 15%, and an independent per-run factor,
6%), the reference the smallest batch, tol 0.1, 90% intervals.
  synthetic  R(B) = E_min (1 + B / B_crit), 6 B_crit x 2 group sizes on a doubling grid of
             P = 4..256 prompts (benchmarks/coverage_critical.py's cases);
  nqm        the exact expected-loss R(B) of the NQM variants (backends/nqm_theory at each batch's
             scaled LR; benchmarks/regret_cases.py's and EDGE_CASES, one per R(B)), on
             the recipe's grid; a batch whose true R is infinite (it diverges) is a failed batch.
             R(B) is flat and then steep there: the shape McCandlish's does not have.
For each: the coverage of the truth by the joint fit's interval (analysis/sample/joint.py, the
chosen shape with the union rule) and by the shape-free interval
(analysis/sample/intervals.shape_free_crossing: shape-averaged, the crossing placed uniformly in
log B between the bounds the bendings allow), and the shape-free interval's median width
(upper / lower end). Prints a table and one JSON line. Usage:
    python benchmarks/coverage_shape_free.py [--reps 80] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from regret_cases import NQM_CASES, _nqm_true_r, nqm_recipe  # noqa: E402

from batchtune.analysis.sample.intervals import shape_free_crossing  # noqa: E402
from batchtune.analysis.sample.joint import fit_joint  # noqa: E402
from batchtune.backends.nqm_theory import nqm_critical_batch_for_recipe  # noqa: E402

TOL, CONFIDENCE, N_SEEDS, SEED_SPREAD, RUN_NOISE = 0.1, 0.9, 3, 0.15, 0.06
B_CRITS = (64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0)
GROUPS = (8, 16)
EDGE_CASES = {  # near the stability edge (issue 32 item 1's curvature power 0.8)
    "p0.8": ["nqm.curvature_power=0.8"],
    "p0.9": ["nqm.curvature_power=0.9"],
    "lr0.045": ["optimizer.lr=0.045"],
}


def synthetic_cases() -> list[tuple[str, np.ndarray, np.ndarray, float]]:
    out = []
    for g in GROUPS:
        b = 4.0 * 2 ** np.arange(7) * g
        for bc in B_CRITS:
            out.append((f"Bc{bc:g}-G{g}", b, 2000.0 * (1 + b / bc), float(b[0] * (1 + TOL) + TOL * bc)))
    return out


def nqm_cases(tmp: str) -> list[tuple[str, np.ndarray, np.ndarray, float]]:
    """regret.py's NQM cases plus EDGE_CASES, one per R(B): a case that differs only in the probe's
    seeds (budget.seeds) has the same true R(B), so it enters once, under its name less "-sN"."""
    variants: dict[tuple[str, ...], str] = {}
    for name, sets in {**NQM_CASES, **EDGE_CASES}.items():
        key = tuple(x for x in sets if not x.startswith("budget.seeds"))
        variants.setdefault(key, name.split("-s")[0] if "budget.seeds" in " ".join(sets) else name)
    out = []
    for sets, name in variants.items():
        NQM_CASES[name] = list(sets)
        cfg = nqm_recipe(name, tmp)
        b = np.array(sorted(p * cfg.candidates.group_size for p in cfg.candidates.prompts), float)
        r = np.array([_nqm_true_r(cfg, int(x)) for x in b])
        out.append((name, b, r, float(nqm_critical_batch_for_recipe(cfg))))
    return out


def simulate(batches: np.ndarray, true_r: np.ndarray, truth: float, reps: int, rng: np.random.Generator):
    """(joint covers, shape-free covers, shape-free width) per repetition."""
    ok = np.isfinite(true_r)
    failed = float(batches[~ok].min()) if (~ok).any() else None
    b = batches[ok]
    rows = []
    for _ in range(reps):
        luck = rng.normal(0.0, SEED_SPREAD, N_SEEDS)
        r = true_r[ok][:, None] * np.exp(luck[None, :] + rng.normal(0.0, RUN_NOISE, (b.size, N_SEEDS)))
        bb, ss = np.repeat(b, N_SEEDS), np.tile(np.arange(N_SEEDS), b.size)
        sf = shape_free_crossing(
            bb, r.ravel(), ss, reference_batch=float(b[0]), tol=TOL, confidence=CONFIDENCE,
            failed_from=failed, seed=int(rng.integers(2**31)),
        )  # fmt: skip
        j = fit_joint(bb, r.ravel(), ss, reference_batch=float(b[0]), tol=TOL, confidence=CONFIDENCE).best
        joint_covers = j.crossing_ci[0] <= truth <= j.crossing_ci[1]
        rows.append((joint_covers, sf.ci[0] <= truth <= sf.ci[1], sf.ci[1] / sf.ci[0]))
    return np.array(rows, dtype=float)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=80)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        families = {"synthetic": synthetic_cases(), "nqm": nqm_cases(tmp)}
    print(
        f"{args.reps} repetitions a case; {N_SEEDS} paired seeds, {100 * SEED_SPREAD:.0f}% seed spread, "
        f"{100 * RUN_NOISE:.0f}% run noise, tol {TOL}, {100 * CONFIDENCE:.0f}% intervals"
    )
    print(
        f"{'family':<10} {'case':<13} {'cross*':>8} {'joint covers':>12} {'shape-free covers':>17} "
        f"{'width':>7}"
    )
    summary: dict[str, dict[str, object]] = {}
    for fam, cases in families.items():
        allrows = []
        for name, b, r, truth in cases:
            rows = simulate(b, r, truth, args.reps, rng)
            allrows.append(rows)
            width = float(np.median(rows[:, 2]))
            print(
                f"{fam:<10} {name:<13} {truth:>8.1f} {rows[:, 0].mean():>12.2f} {rows[:, 1].mean():>17.2f} "
                f"{'inf' if math.isinf(width) else f'{width:.2f}':>7}"
            )
        a = np.vstack(allrows)
        per = [x[:, 1].mean() for x in allrows]
        summary[fam] = {
            "cases": len(cases),
            "joint_coverage": round(float(a[:, 0].mean()), 3),
            "joint_coverage_range": [round(float(min(x[:, 0].mean() for x in allrows)), 3),
                                     round(float(max(x[:, 0].mean() for x in allrows)), 3)],
            "shape_free_coverage": round(float(a[:, 1].mean()), 3),
            "shape_free_coverage_range": [round(float(min(per)), 3), round(float(max(per)), 3)],
            "shape_free_cases_85_95": int(sum(0.85 <= p <= 0.95 for p in per)),
            "shape_free_median_width": round(float(np.median(a[:, 2])), 2),
        }  # fmt: skip
    print("cross*: the true 1+tol crossing; covers: share of repetitions whose 90% interval holds it; width: "
          "the shape-free interval's upper / lower end (median)")  # fmt: skip
    print(json.dumps({"benchmark": "coverage_shape_free", "reps": args.reps, "seed": args.seed,
                      "summary": summary, "wall_s": round(time.perf_counter() - t0, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
