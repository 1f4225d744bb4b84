"""One NQM case of benchmarks/regret.py in detail: every candidate's per-seed samples-to-target, the
probe's median and interval, the truth, and the point and expected time the ranking orders by.

    python benchmarks/regret_case.py lr0.015 > benchmarks/out/regret_case_lr0.015.txt

Truth: R from the closed-form expected SGD loss and T from the simulation's own time model
(regret_cases.py). Simulated seconds; deterministic per seed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from regret_cases import NQM_CASES, _nqm_true_r, nqm_true_time, probe_and_recommend  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=sorted(NQM_CASES))
    args = ap.parse_args()
    cfg, rec = probe_and_recommend(args.case)
    per_seed = {c.label: c.estimate for c in rec.efficiency.candidates}
    true_t = {}
    print(f"# NQM case {args.case}: {' '.join(NQM_CASES[args.case])}; target loss {cfg.target.value}")
    print(
        f"{'candidate':10} {'N':>5} {'R per seed (k samples)':<36} {'R median [90% CI]':>24} "
        f"{'R true':>7} {'T':>7} {'E[T]':>7} {'T true':>7} rank"
    )
    for c in sorted(rec.ranking.candidates, key=lambda c: c.batch_responses):
        b = int(c.batch_responses)
        r_true = _nqm_true_r(cfg, b)
        true_t[c.name] = nqm_true_time(cfg, b)
        est = per_seed[c.name]
        seeds = " ".join(f"{v / 1e3:.1f}" for v in est.per_seed) if est else "-"
        ci = f"{c.samples_to_target:,.0f} [{c.samples_ci[0]:,.0f}, {c.samples_ci[1]:,.0f}]"
        print(
            f"{c.name:10} {b:>5} {seeds:<36} {ci:>24} {r_true:>7,.0f} {c.time_to_target_s:>7.1f} "
            f"{c.expected_time_s:>7.1f} {true_t[c.name]:>7.1f} {c.rank:>4}"
        )
    best = min(true_t, key=lambda k: true_t[k])
    regret = true_t[rec.ranking.winner] / true_t[best]
    print(f"recommended {rec.ranking.winner}; best {best}; regret {regret:.3f}")
    print(f"reason: {rec.ranking.reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
