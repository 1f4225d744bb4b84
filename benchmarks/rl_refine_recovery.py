"""Does adding P between grid points (measure/rl_refine.py) pin the RL critical batch down, and at what cost?

The cases and the measurement model are benchmarks/coverage_shape_free.py's: the true R(B) of
  synthetic  R(B) = E_min (1 + B / B_crit), 6 B_crit x 2 group sizes, P = 4..256 doubling;
  nqm        the exact expected-loss R(B) of the NQM variants (backends/nqm_theory at each batch's
             scaled LR), on the recipe's grid P = 1..128; a batch that diverges is a failed batch;
measured as the probe measures it: 3 paired seeds a batch (a log-normal seed effect shared by every
batch of a seed, 15%, and an independent per-run factor, 6%), the reference the smallest batch,
tol 0.1, 90% intervals, every repetition through analysis.sample.critical.critical_batch. A
refined arm then runs the probe's rounds (rl_refine.next_round on the analysis of the batches so
far): each added P is measured at the same seeds (same seed effects, new run noise, the true R at
its batch and scaled LR), and the analysis is redone, until the rounds stop.

Per arm (grid only; then a budget of 4 or 2 added candidates, 1 or 2 a round; the default is 4, 1):
  exact      the critical batch equals the largest measured batch whose true R(B)/R(B0) <= 1 + tol
             (the issue's "exact": on the batches that arm measured);
  tight      the critical batch is at or below the true crossing X* and within 2^(1/4) of it
             (the grid step the refinement aims at; a doubling grid reaches it only by luck);
  gap        median log2(X* / critical batch), octaves; over: the critical batch is above X*;
  covers     the 90% shape-free interval holds X*; width: its upper / lower end (median);
  runs       runs per probe (grid + added), and the added runs per probe;
  sf tight / sf over   tight and over for the largest usable measured batch at or below the
             shape-free crossing: a critical batch read off it (the tool's comes from the joint
             fit's crossing, corrected by the per-batch verdicts).
Prints a table and one JSON line. Usage:
    python benchmarks/rl_refine_recovery.py [--reps 12] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from coverage_shape_free import SEED_SPREAD, nqm_cases  # noqa: E402
from regret_cases import _nqm_true_r, nqm_recipe  # noqa: E402

from batchtune.analysis.sample.critical import CriticalBatch, critical_batch  # noqa: E402
from batchtune.analysis.sample.curves import TargetCrossing  # noqa: E402
from batchtune.analysis.sample.seeds import estimate_over_seeds  # noqa: E402
from batchtune.measure.rl_refine import FINE_STEP, next_round  # noqa: E402

TOL, CONFIDENCE, N_SEEDS, RUN_NOISE = 0.1, 0.9, 3, 0.06
B_CRITS = (64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0)
GROUPS = (8, 16)
# budget of added candidates, candidates a round; "4, 1 a round" is probe.refine_rl's default rule
ARMS = {"grid": (0, 0), "4, 1 a round": (4, 1), "2, 1 a round": (2, 1), "4, 2 a round": (4, 2)}


class Case:
    """A true R(N) at any batch N = P G (inf: diverges), its crossing X* and its grid of P."""

    def __init__(self, name: str, prompts: list[int], g: int, true_r: Callable[[int], float], x: float):
        self.name, self.prompts, self.g, self.true_r, self.crossing = name, prompts, g, true_r, x
        self._r: dict[int, float] = {}

    def r(self, p: int) -> float:
        if p not in self._r:
            self._r[p] = self.true_r(p * self.g)
        return self._r[p]


def synthetic() -> list[Case]:
    out = []
    for g in GROUPS:
        for bc in B_CRITS:
            x = 4 * g * (1 + TOL) + TOL * bc
            out.append(
                Case(
                    f"Bc{bc:g}-G{g}", [4 * 2**k for k in range(7)], g, lambda n, bc=bc: 2000 * (1 + n / bc), x
                )
            )
    return out


def nqm(tmp: str) -> list[Case]:
    out = []
    for name, b, _, x in nqm_cases(tmp):
        cfg = nqm_recipe(name, tmp)
        g = cfg.candidates.group_size
        out.append(Case(name, sorted(int(v) // g for v in b), g, lambda n, cfg=cfg: _nqm_true_r(cfg, n), x))
    return out


def analyse(case: Case, prompts: list[int], runs: dict[int, np.ndarray]) -> CriticalBatch:
    ok = [p for p in prompts if math.isfinite(case.r(p))]
    failed = [float(p * case.g) for p in prompts if not math.isfinite(case.r(p))]
    ests = [
        estimate_over_seeds([TargetCrossing(float(v), False, 1e15) for v in runs[p]], seed_ids=range(N_SEEDS))
        for p in ok
    ]
    return critical_batch(
        [float(p * case.g) for p in ok], ests, tol=TOL, confidence=CONFIDENCE, failed_batches=failed
    )


def one_probe(case: Case, budget: int, per_round: int, rng: np.random.Generator) -> tuple[float, ...]:
    luck = rng.normal(0.0, SEED_SPREAD, N_SEEDS)

    def measure(p: int) -> np.ndarray:
        return case.r(p) * np.exp(luck + rng.normal(0.0, RUN_NOISE, N_SEEDS))

    prompts = list(case.prompts)
    runs = {p: measure(p) for p in prompts}
    cb = analyse(case, prompts, runs)
    added = 0
    for k in range(1, 9):
        if budget <= 0:
            break
        r = next_round(prompts, case.g, cb, budget - added, k, per_round=per_round)
        if r is None or not r.prompts:
            break
        for p in r.prompts:
            runs[p] = measure(p)
        prompts = sorted({*prompts, *r.prompts})
        added += len(r.prompts)
        cb = analyse(case, prompts, runs)
    r0 = case.r(prompts[0])
    within = [p * case.g for p in prompts if case.r(p) / r0 <= 1 + TOL]
    true_crit = float(max(within))
    crit = float(cb.batch) if cb.batch is not None else math.nan
    x = case.crossing
    sf = cb.shape_free
    lo, hi = sf.ci if sf is not None else (math.nan, math.nan)
    # what a critical batch read off the shape-free crossing would be (the tool's comes from the joint
    # fit's crossing, corrected by the verdicts): the largest usable measured batch at or below it
    usable = [p * case.g for p in prompts if math.isfinite(case.r(p))]
    sf_crit = float(max([b for b in usable if sf is not None and b <= sf.crossing], default=usable[0]))
    return (
        crit == true_crit,
        crit <= x * (1 + 1e-9) and x / crit <= FINE_STEP * 1.01,
        math.log2(x / crit),
        crit > x * (1 + 1e-9),
        lo <= x <= hi,
        hi / lo,
        N_SEEDS * len(prompts),
        N_SEEDS * added,
        sf_crit <= x * (1 + 1e-9) and x / sf_crit <= FINE_STEP * 1.01,
        sf_crit > x * (1 + 1e-9),
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--family", choices=("synthetic", "nqm"), default=None, help="one family only")
    args = ap.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        families = {"synthetic": synthetic(), "nqm": nqm(tmp)}
    print(
        f"{args.reps} repetitions a case and arm (the same draws for every arm); {N_SEEDS} paired seeds, "
        f"{100 * SEED_SPREAD:.0f}% seed spread, {100 * RUN_NOISE:.0f}% run noise, tol {TOL}, "
        f"{100 * CONFIDENCE:.0f}% intervals"
    )
    cols = ("exact", "tight", "gap", "over", "covers", "width", "runs", "added", "sf tig", "sf ovr")
    print(f"{'family':<10} {'arm':<14} " + " ".join(f"{c:>6}" for c in cols))
    summary: dict[str, dict[str, object]] = {}
    for fam, cases in families.items():
        if args.family and fam != args.family:
            continue
        for arm, (budget, per) in ARMS.items():
            rows = []
            for i, case in enumerate(cases):
                rng = np.random.default_rng([args.seed, i, len(fam)])  # the same draws in every arm
                rows += [one_probe(case, budget, per, rng) for _ in range(args.reps)]
            a = np.array(rows, dtype=float)
            s = {
                "exact": round(float(a[:, 0].mean()), 3),
                "tight": round(float(a[:, 1].mean()), 3),
                "gap_octaves_median": round(float(np.nanmedian(a[:, 2])), 3),
                "over": round(float(a[:, 3].mean()), 3),
                "covers": round(float(a[:, 4].mean()), 3),
                "width_median": round(float(np.nanmedian(a[:, 5])), 2),
                "runs_mean": round(float(a[:, 6].mean()), 1),
                "added_runs_mean": round(float(a[:, 7].mean()), 1),
                "sf_tight": round(float(a[:, 8].mean()), 3),
                "sf_over": round(float(a[:, 9].mean()), 3),
            }
            summary[f"{fam}/{arm}"] = {"cases": len(cases), **s}
            vals = " ".join(f"{v:>6.2f}" if isinstance(v, float) else f"{v:>6}" for v in s.values())
            print(f"{fam:<10} {arm:<14} {vals}")
    print(
        "exact: critical batch = the largest measured batch within 1+tol (truth); tight: at or below the "
        "true crossing and within 2^(1/4) of it; gap: median log2(crossing / critical batch); over: above "
        "the crossing; covers / width: the 90% shape-free interval; runs: per probe (3 seeds a candidate), "
        "added: by the refinement rounds; sf tig / sf ovr: tight / over for the largest measured batch at or "
        "below the shape-free crossing (a critical batch read off it, which the tool does not do)"
    )
    print(json.dumps({"benchmark": "rl_refine_recovery", "reps": args.reps, "seed": args.seed,
                      "summary": summary, "wall_s": round(time.perf_counter() - t0, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
