"""Measured two-process async runs on tiny-grpo, for the pipeline model to predict (issue 30).

Each setting (staleness bound k, in-flight cap, sync_every) runs recipes/tiny-grpo.toml's P4xG8
candidate for STEPS trainer steps with algorithm.mode = async (a rollout worker process and the
trainer, backends/torch_rl/async_run.py), and a sync run of the same candidate gives the per-part
times measured without overlap. Steady state: the first SKIP steps (the worker's start-up) are left
out. Wall time per 100 steps = 100 x mean step wall_s; the parts are medians per step.

    python benchmarks/async_runs.py > benchmarks/out/async_runs.txt
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batchtune.backends.spec import Candidate, RunSpec  # noqa: E402
from batchtune.backends.torch_rl import TorchRLBackend  # noqa: E402
from batchtune.recipe.load import load_recipe  # noqa: E402

STEPS, SKIP, P, G = 60, 5, 4, 8
SETTINGS = [("sync", 0, 0, 1), ("async", 0, 1, 1), ("async", 1, 1, 1), ("async", 2, 2, 1), ("async", 2, 2, 3)]


def run(root: Path, mode: str, k: int, cap: int, sync_every: int) -> list:
    overrides = [
        f'algorithm.mode="{mode}"', f"algorithm.in_flight_cap={cap}", f"algorithm.sync_every={sync_every}",
        f"budget.max_samples={STEPS * P * G}", "task.eval_size=0", 'target.metric="reward"',
    ]  # fmt: skip
    recipe = load_recipe(str(ROOT / "recipes" / "tiny-grpo.toml"), overrides)
    cand = Candidate(f"P{P}xG{G}", P, G, recipe.optimizer.lr * 2**0.5, "sqrt", staleness=k)
    spec = RunSpec("bench", cand, 0, recipe, root / "runs" / f"{mode}-{k}", recipe.optimizer.lr, 16)
    return list(TorchRLBackend().train(spec))


def med(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def main() -> None:
    print(f"# benchmarks/async_runs.py: tiny-grpo P{P}xG{G}, {STEPS} trainer steps, first {SKIP} left out")
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"# machine: {platform.machine()} {os.cpu_count()} cores, load {load}")
    print(
        "# mode   k cap sync | wall_s/100 steps | gen_s  train_s  sync_s  qwait_s  wwait_s (medians)", end=""
    )
    print(" | staleness mean max")
    root = Path(tempfile.mkdtemp())
    run(root, "sync", 0, 0, 1)  # warm start into the cache, off the clock
    for mode, k, cap, sync_every in SETTINGS:
        t0 = time.perf_counter()
        recs = run(root, mode, k, cap, sync_every)[SKIP:]
        m = [r.metrics for r in recs]
        wall = [x["wall_s"] for x in m] if mode != "sync" else [r.gen_s + r.train_s + r.other_s for r in recs]
        lag = [x.get("staleness", 0.0) for x in m]
        print(
            f"{mode:6} {k:2d} {cap:3d} {sync_every:4d} | {100 * statistics.fmean(wall):16.2f} | "
            f"{med([r.gen_s for r in recs]):.4f} {med([r.train_s for r in recs]):.4f} "
            f"{med([x.get('sync_s', 0.0) for x in m]):.4f} "
            f"{med([x.get('queue_wait_s', 0.0) for x in m]):.4f} "
            f"{med([x.get('worker_wait_s', 0.0) for x in m]):.4f} | "
            f"{statistics.fmean(lag):.2f} {max(lag):.0f}"
            f"   (run {time.perf_counter() - t0:.1f} s)"
        )


if __name__ == "__main__":
    main()
