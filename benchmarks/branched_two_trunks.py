"""Would a second trunk make the branched probe's answer safe? A measurement without new code, on the NQM.

    python benchmarks/branched_two_trunks.py > benchmarks/out/branched_two_trunks.txt

benchmarks/branched_run_length.py found 2 of 8 one-trunk probes adopting 512 (the SGD stability edge)
whatever the confirmation seeds or windows: every branch of a checkpoint starts from its trunk's
state. Here each of 16 seeds runs the same one-trunk probe as there (`budget.seeds=[k]`), and seeds
2k and 2k+1 are paired as two independent trunks whose answers must agree: the pair recommends the
smaller of its two picks (an adoption confirmed by a second trunk), at the cost of both probes.
Cost = both probes' samples / the closed form's samples at the pair's pick; regret as in
branched_run_length.py. At loss 1.0 (shipped, 49 steps at the best batch) and 0.5 (168 steps).
Simulated seconds; deterministic per seed.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from branched_cost import tune_json  # noqa: E402
from branched_run_length import SETTING, grid_throughput, true_r  # noqa: E402


def main() -> None:
    t0 = time.perf_counter()
    thr = grid_throughput()
    print(f"# setting: {' '.join(SETTING)}; one trunk per probe, seeds 0-15, paired 2k and 2k+1")
    print(
        "target | one trunk: picks (seeds 0-15) | regret<=1.05 | "
        "two trunks: picks (pairs) | cost med [max] | regret<=1.05"
    )
    for target in (1.0, 0.5):
        r = {n: true_r(b, target) for n, (b, _) in thr.items()}
        t = {n: r[n] / thr[n][1] for n in thr}
        best = min(t, key=lambda k: t[k])
        one = {}
        for seed in range(16):
            d = tune_json([*SETTING, f"target.value={target}", f"budget.seeds=[{seed}]"])
            assert d is not None, f"the probe at seed {seed} failed"
            one[seed] = (d["recommended"]["name"], d["probe_cost"]["samples"])
        pairs = []
        for k in range(8):
            (a, sa), (b, sb) = one[2 * k], one[2 * k + 1]
            rec = min(a, b, key=lambda n: thr[n][0])
            pairs.append((rec, (sa + sb) / r[rec], t[rec] / t[best]))
        singles_ok = sum(t[one[s][0]] / t[best] <= 1.05 for s in one)
        costs = [p[1] for p in pairs]
        print(
            f"{target} | {' '.join(one[s][0] for s in range(16))} | {singles_ok}/16 | "
            f"{' '.join(p[0] for p in pairs)} | {statistics.median(costs):.2f} [{max(costs):.2f}] | "
            f"{sum(p[2] <= 1.05 for p in pairs)}/8",
            flush=True,
        )
    print(f"# total wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
