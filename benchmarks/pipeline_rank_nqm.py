"""rank_async (batchtune/analysis/decide/async_rank.py) on the async NQM instances of async_nqm_regret.py.

R per (B, k, u) from the 8-seed probe (point: the seed-mean curve's crossing; interval: the seeds'
own crossings, min..max, inf when a seed never crossed), times from the instance's linear time
model on one device (the two-process case), so the ranking meets the exact truth of
async_nqm_regret.py: regret = T_true(rank_async's pick) / T_true(best), and its verdict.
Usage: python benchmarks/pipeline_rank_nqm.py  (writes benchmarks/out/pipeline_rank_nqm.txt)
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from async_nqm_regret import BATCHES, INSTANCES, KS, SEEDS, US, Instance, lr_of, pipeline_of  # noqa: E402

from batchtune.analysis.decide.async_rank import REstimate, StageTimes, async_verdict, rank_async  # noqa: E402
from batchtune.backends.nqm_async import (  # noqa: E402
    expected_async_samples_to_target,
    simulate_samples_to_target,
)
from batchtune.recipe.schema import NQMConfig  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "pipeline_rank_nqm.txt"


def one(inst: Instance) -> list[str]:
    cfg = NQMConfig(dim=64, noise_scale=inst.noise, curvature_power=inst.power)
    target = 0.15 * 0.5 * sum((1.0 / i**inst.power) for i in range(1, 65))
    times = {
        b: StageTimes(2.0 + inst.gen_per_resp_s * b, 0.5 + inst.train_per_resp_s * b, inst.sync_s)
        for b in BATCHES
    }
    est, truth = [], {}
    for b, k, u in itertools.product(BATCHES, KS, US):
        theta, d = pipeline_of(inst, b, k, u)
        kw = dict(lr=lr_of(b), batch=b, delay=d, updates_per_batch=u, target_loss=target)
        truth[(b, k, u)] = expected_async_samples_to_target(cfg, **kw) / theta  # type: ignore[arg-type]
        r, runs = simulate_samples_to_target(cfg, seeds=SEEDS, max_updates=4000, **kw)  # type: ignore[arg-type]
        est.append(REstimate(b, k, u, r, min(min(runs), r), max(max(runs), r)))
    ranked = rank_async(est, times)
    top = ranked[0]
    best = min(truth.values())
    regret = truth[(top.batch, top.staleness, top.updates_per_batch)] / best
    head = (
        f"noise {inst.noise} p {inst.power} gen:train "
        f"{inst.gen_per_resp_s / inst.train_per_resp_s:.0f}:1  pick {top.mode} B={top.batch} "
        f"k={top.staleness} u={top.updates_per_batch} T={top.t:.1f} [{top.t_lo:.1f}, {top.t_hi:.1f}]  "
        f"regret {regret:.3f}"
    )
    return [head, *("    " + line for line in async_verdict(ranked))]


def main() -> int:
    lines = ["rank_async on the async NQM instances (8-seed probe R, interval = seeds' min..max)", ""]
    for inst in INSTANCES:
        lines += one(inst)
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
