"""`batchtune tune recipes/nqm.toml --set probe.mode=branched` as a user runs it: the recipe's own
seeds (budget.seeds = [0, 1, 2]) and the branch defaults, at the shipped target and at lower ones.

    python benchmarks/branched_shipped.py > benchmarks/out/branched_shipped.txt

Per target: the pick, the probe's samples, cost (truth) = probe samples / the closed form's samples
at the pick, cost (tool) = `probe_cost.ratio` of --json, and regret = T(pick) / T(best) with the
closed-form R and the grid probe's simulated throughput (benchmarks/branched_run_length.py, one
branched setting on 8 one-seed probes, is the spread over seeds). Simulated seconds; deterministic.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from branched_cost import tune_json  # noqa: E402
from branched_run_length import TARGETS, grid_throughput, true_r  # noqa: E402


def main() -> None:
    thr = grid_throughput()
    print(
        "# batchtune tune recipes/nqm.toml --set probe.mode=branched [--set target.value=T]; "
        "budget.seeds [0, 1, 2]"
    )
    print("target | best | true full run (steps) | pick | probe samples | cost truth | cost tool | regret")
    for target in TARGETS:
        r = {name: true_r(n, target) for name, (n, _) in thr.items()}
        t = {name: r[name] / thr[name][1] for name in thr}
        best = min(t, key=lambda k: t[k])
        d = tune_json(["probe.mode=branched", f"target.value={target}"])
        if d is None:
            print(f"{target} | {best} | failed")
            continue
        pick, spent = d["recommended"]["name"], d["probe_cost"]["samples"]
        print(
            f"{target} | {best} | {r[best]:,.0f} ({r[best] / thr[best][0]:.0f}) | {pick} | {spent:,} | "
            f"{spent / r[pick]:.2f}x | {d['probe_cost']['ratio']:.2f}x | {t[pick] / t[best]:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
