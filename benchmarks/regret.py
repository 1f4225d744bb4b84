"""Ground-truth benchmark: how far is the recommendation from the best choice? (docs/benchmarks.md)

For each case: the oracle's best time-to-target T(best) among the candidate batches against the TRUE
time-to-target of the batch the tool recommends (regret = T(recommended) / T(best)), the critical
batch against the truth, and the probe's cost in samples against one full run at the best batch.
Cases (benchmarks/regret_cases.py, benchmarks/regret_tiny.py): NQM instances across noise,
curvature, dimension and LR (truth: closed-form expected SGD loss and the simulation's time model);
synthetic RL curves from 6 critical batches x 2 group sizes (R(B) = E_min (1 + B/B_crit) exactly,
a known Θ(B)); with --tiny, tiny-grpo and tiny-ppo against their exhaustive runs (cached).

Prints a table and one JSON line. Usage:
    python benchmarks/regret.py [--quick] [--only nqm|synthetic] [--tiny [--tiny-seeds 0,1,2,...]]
    python benchmarks/regret.py --cases p0.8,p0.8-s9,p0.75-s3,p0.85-s6 > benchmarks/out/regret_edge.txt
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from regret_cases import (  # noqa: E402
    NQM_CASES,
    PERFECT_SYN,
    QUICK_NQM,
    QUICK_SYN,
    SYN_B_CRITS,
    SYN_GROUPS,
    CaseResult,
    run_nqm_case,
    run_synthetic_case,
)


def _f(x: float | None, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "inf" if math.isinf(x) else f"{x:.{digits}f}"


def table(rows: list[CaseResult]) -> str:
    head = (
        f"{'kind':<9} {'case':<14} {'best':>5} {'rec':>5} {'regret':>7} {'bound':>6} {'crit*':>6} "
        f"{'crit':>6} {'fit':>5} {'cross*':>7} {'cross [90% CI]':>20} {'shape-free 90%':>15} "
        f"{'probe/full':>10} {'wall s':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        ci = f"{_f(r.crossing)} [{_f(r.crossing_ci[0])}, {_f(r.crossing_ci[1])}]" if r.crossing_ci else "-"
        sf = f"[{_f(r.shape_free_ci[0])}, {_f(r.shape_free_ci[1])}]" if r.shape_free_ci else "-"
        lines.append(
            f"{r.kind:<9} {r.name:<14} {r.best_batch:>5.0f} {r.recommended:>5.0f} {r.regret:>7.3f} "
            f"{_f(r.regret_high, 3):>6} "
            f"{r.true_critical:>6.0f} {_f(r.critical):>6} {_f(r.critical_fit):>5} {_f(r.true_crossing):>7} "
            f"{ci:>20} {sf:>15} "
            f"{r.cost_ratio:>10.1f} {r.wall_s:>7.1f}"
        )
    return "\n".join(lines)


def summary(rows: list[CaseResult]) -> dict[str, object]:
    out: dict[str, object] = {}
    for kind in sorted({r.kind for r in rows}):
        rs = [r for r in rows if r.kind == kind]
        covered = [  # an infinite truth (perfect scaling) is covered by an interval open above
            r.crossing_ci[0] <= r.true_crossing <= r.crossing_ci[1]
            for r in rs
            if r.crossing_ci and not math.isnan(r.true_crossing)
        ]
        free = [
            r.shape_free_ci[0] <= r.true_crossing <= r.shape_free_ci[1]
            for r in rs
            if r.shape_free_ci and not math.isnan(r.true_crossing)
        ]
        out[kind] = {
            "cases": len(rs),
            "max_regret": max(r.regret for r in rs),
            "optimal": sum(r.regret <= 1.0 + 1e-9 for r in rs),
            "regret_le_1.05": sum(r.regret <= 1.05 for r in rs),
            "critical_exact": sum(r.critical_steps_off == 0 for r in rs),
            "critical_within_one_step": sum(r.critical_steps_off <= 1 for r in rs),
            "critical_exact_by_fit_alone": sum(r.critical_fit_steps_off == 0 for r in rs),
            "critical_within_one_step_by_fit_alone": sum(r.critical_fit_steps_off <= 1 for r in rs),
            "crossing_ci_covers_truth": f"{sum(covered)}/{len(covered)}",
            "shape_free_ci_covers_truth": f"{sum(free)}/{len(free)}",
            "regret_bound_covers_truth": f"{sum(r.bound_covers for r in rs)}/{len(rs)}",
            "median_probe_over_full_run": sorted(r.cost_ratio for r in rs)[len(rs) // 2],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 NQM + 2 synthetic cases (the CI test's)")
    ap.add_argument("--only", choices=("nqm", "synthetic"), default=None)
    ap.add_argument("--cases", default="", help="only these NQM cases (names of regret_cases.NQM_CASES)")
    ap.add_argument("--tiny", action="store_true", help="also tiny-grpo/tiny-ppo vs exhaustive runs")
    ap.add_argument("--tiny-seeds", default="10,11,12", help="seeds of the exhaustive runs (the truth)")
    ap.add_argument("--tiny-recipes", default="tiny-grpo,tiny-ppo")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows: list[CaseResult] = []
    cases = [c for c in args.cases.split(",") if c]
    if cases:
        args.only = "nqm"
    if args.only in (None, "synthetic"):
        syn = QUICK_SYN if args.quick else [(b, g) for g in SYN_GROUPS for b in SYN_B_CRITS]
        rows += [run_synthetic_case(b, g) for b, g in syn]
        if not args.quick:
            rows += [run_synthetic_case(b, g, seed) for b, g, seed in PERFECT_SYN]
    if args.only in (None, "nqm"):
        for name in cases or (QUICK_NQM if args.quick else NQM_CASES):
            rows.append(run_nqm_case(name))
            print(f"# {name}: regret {rows[-1].regret:.3f} ({rows[-1].wall_s:.0f} s)", file=sys.stderr)
    if args.tiny:
        from regret_tiny import run_tiny_case

        seeds = [int(s) for s in args.tiny_seeds.split(",")]
        rows += [run_tiny_case(name, seeds) for name in args.tiny_recipes.split(",")]
    print(table(rows))
    print(
        "crit* / cross*: the true critical batch on the grid and the true 1+tol crossing; crit: the tool's "
        "critical batch; fit: the one the joint fit's crossing alone gives (the estimate before "
        "2026-12-03); regret = "
        "T_true(recommended) / T_true(best); shape-free: the crossing's interval without a model of R(B) "
        "(inf: no critical batch in the measured range); bound = the tool's regret_high (how much "
        "faster than its pick another batch could be, 90% per comparison); probe/full = samples the "
        "probe spent / true R at the best batch"
    )
    print(
        json.dumps(
            {
                "benchmark": "regret",
                "wall_s": round(time.perf_counter() - t0, 1),
                "summary": summary(rows),
                "cases": [
                    {
                        "kind": r.kind,
                        "case": r.name,
                        "best": r.best_batch,
                        "recommended": r.recommended,
                        "regret": round(r.regret, 4),
                        "regret_high": round(r.regret_high, 4),
                        "true_critical": r.true_critical,
                        "critical": r.critical,
                        "critical_fit_alone": r.critical_fit,
                        "true_crossing": None if math.isnan(r.true_crossing) else r.true_crossing,
                        "crossing": r.crossing,
                        "crossing_ci": r.crossing_ci,
                        "shape_free_ci": r.shape_free_ci,
                        "probe_over_full_run": round(r.cost_ratio, 2),
                    }
                    for r in rows
                ],
            },
            default=str,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
