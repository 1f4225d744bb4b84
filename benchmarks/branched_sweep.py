"""Sweep of cheap branched settings on the NQM (recipes/nqm.toml): cost and regret on 8 seed sets each.

    python benchmarks/branched_sweep.py 1024,1536,2048 1024,2048 1,2 8 > benchmarks/out/branched_sweep.txt

Arguments: trunk samples, window samples, seeds per probe, number of seed sets (seeds k*n .. k*n+n-1),
then any further `--set` overrides for every setting (e.g. branch.confirm_seeds=3).
Every setting: one checkpoint at the trunk's end, max window factor 1.5. For each seed set
`batchtune tune recipes/nqm.toml --json` with probe.mode = branched; cost = `probe_cost.ratio`
(probe samples / one full run at the recommendation); regret = T(recommended) / T(best), T from the
closed-form expected loss and the grid probe's throughput (as benchmarks/branched_cost.py).
Prints one line per setting: the worst and median cost, the worst regret, how many seed sets are
at regret <= 1.05, and each seed set's recommendation. Simulated seconds; deterministic per seed.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from branched_cost import true_times, tune_json  # noqa: E402


def one_checkpoint(trunk: int, window: int, seeds: list[int]) -> list[str]:
    """The `--set`s of one sweep setting: one checkpoint at the trunk's end, max window 1.5x."""
    return [
        "probe.mode=branched",
        f"branch.trunk_samples={trunk}",
        f"branch.window_samples={window}",
        "branch.checkpoints=[1.0]",
        "branch.max_window_factor=1.5",
        f"budget.seeds={seeds}",
    ]


def main() -> None:
    trunks, windows, n_seeds = (list(map(int, a.split(","))) for a in sys.argv[1:4])
    n_sets = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    more = sys.argv[5:]
    if more:
        print(f"# with {' '.join(more)}")
    grid = tune_json(["probe.mode=grid"])
    assert grid is not None, "the grid probe failed"
    t = true_times(grid)
    best = min(t.values())
    for trunk in trunks:
        for window in windows:
            for ns in n_seeds:
                rows: list[tuple[float, float, str]] = []
                for k in range(n_sets):
                    seeds = list(range(k * ns, k * ns + ns))
                    d = tune_json([*one_checkpoint(trunk, window, seeds), *more])
                    if d is None:
                        rows.append((math.nan, math.nan, "fail"))
                        continue
                    rec = d["recommended"]["name"]
                    rows.append((d["probe_cost"]["ratio"], t[rec] / best, rec))
                costs = [r[0] for r in rows]
                regrets = [r[1] for r in rows]
                print(
                    f"trunk {trunk} W {window} seeds {ns}: cost max {max(costs):.2f} "
                    f"med {sorted(costs)[len(costs) // 2]:.2f} | regret max {max(regrets):.3f} "
                    f"n<=1.05 {sum(r <= 1.05 for r in regrets)}/{len(regrets)} | recs {[r[2] for r in rows]}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
