"""The RL refinement end to end on the NQM: probe, profile-gen and recommend as a user runs them,
with and without ``probe.refine_rl`` (measure/rl_refine.py), against the closed-form truth.

Cases: benchmarks/regret_cases.py's NQM instances named on the command line (default four: the
shipped one, one near the stability edge, two noise levels). Per case and arm: the critical batch
against the true 1+tol crossing X* (and against the largest measured batch truly within 1+tol),
the quoted crossing and its interval, the regret of the pick (true time-to-target of the pick over
the best measured batch's; over the grid's batches for both arms, so the two are comparable: a
refined pick between grid points is scored at its own true time), the probe's runs and samples.
Prints a table and one JSON line. Usage:
    python benchmarks/rl_refine_nqm.py [CASE ...]
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from regret_cases import NQM_CASES, _nqm_true_r, nqm_true_time, probe_and_recommend  # noqa: E402

from batchtune.backends.nqm_theory import nqm_critical_batch_for_recipe  # noqa: E402

DEFAULT = ("shipped", "p0.8-s9", "noise3", "noise30")


def one(name: str, refine: bool, workdir: str) -> dict[str, object]:
    arm = f"{name}+refine" if refine else name
    NQM_CASES[arm] = [*NQM_CASES[name], *(["probe.refine_rl=true"] if refine else [])]
    t0 = time.perf_counter()
    cfg, rec = probe_and_recommend(arm, workdir)
    eff, crit = rec.efficiency, rec.efficiency.critical
    main = sorted(c.batch_responses for c in eff.candidates if c.family == "main")
    grid = sorted(p * cfg.candidates.group_size for p in cfg.candidates.prompts)
    r = {b: _nqm_true_r(cfg, b) for b in main}
    t = {b: nqm_true_time(cfg, b) for b in {*main, *grid}}
    within = [b for b in main if math.isfinite(r[b]) and r[b] / r[main[0]] <= 1 + cfg.target.tolerance]
    x = float(nqm_critical_batch_for_recipe(cfg))
    q = crit.quoted_crossing if crit is not None else None
    pick = int(rec.winner.batch_responses)
    best_grid = min(t[b] for b in grid)
    return {
        "case": name,
        "refine": refine,
        "critical": crit.batch if crit is not None else None,
        "true_crossing": round(x, 1),
        "exact": crit is not None and crit.batch == max(within),
        "tight": crit is not None
        and crit.batch is not None
        and crit.batch <= x
        and x / crit.batch <= 2**0.25 * 1.01,
        "crossing": None if q is None else round(q[0], 1),
        "crossing_ci": None if q is None else [round(v, 1) for v in q[1]],
        "pick": pick,
        "regret_vs_grid_best": round(t[pick] / best_grid, 4) if pick in t else None,
        "added": [b for b in main if b not in grid],
        "main_candidates": len(main),
        "probe_samples": int(eff.total_samples),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    names = sys.argv[1:] or list(DEFAULT)
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for refine in (False, True):
                rows.append(one(name, refine, tmp))
                row = rows[-1]
                print(
                    f"{name:<10} {'refined' if refine else 'grid':<8} critical {row['critical']} "
                    f"(X* {row['true_crossing']}, exact {row['exact']}, tight {row['tight']}); "
                    f"crossing {row['crossing']} {row['crossing_ci']}; pick N={row['pick']} regret "
                    f"{row['regret_vs_grid_best']}; added {row['added']}; "
                    f"probe {row['probe_samples']:,} samples, {row['wall_s']} s",
                    flush=True,
                )
    gain = [
        (a["probe_samples"], b["probe_samples"]) for a, b in zip(rows[::2], rows[1::2], strict=True)
    ]  # fmt: skip
    print(json.dumps({"benchmark": "rl_refine_nqm", "rows": rows,
                      "probe_samples_ratio_median": round(float(np.median([b / a for a, b in gain])), 3),
                      "wall_s": round(time.perf_counter() - t0, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
