"""How a branched probe's cost scales with the length of the run it tunes, on the NQM.

    python benchmarks/branched_run_length.py > benchmarks/out/branched_run_length.txt
    python benchmarks/branched_run_length.py branch.confirm_rejections=true \
        > benchmarks/out/branched_run_length_confirm_rejections.txt

recipes/nqm.toml's run is short: its target (loss 1.0) takes ~48 steps at the best batch, so a
trunk and windows of a few of the largest batch's steps are a large share of it. Here the same
recipe is tuned to lower targets (longer runs: the closed form's R(8) is 12.3k samples at loss 1.0,
41.7k at 0.5 and 94.8k at 0.25, ~4x the SGD noise floor; at 0.3 and below 512 never gets there)
with ONE branched setting held fixed (trunk 2048 with checkpoints at 0.5 and 1.0,
windows of 1024, max window 1.5x, one seed per probe plus the confirmation seeds the search adds),
on 8 seeds each (`budget.seeds=[k]`, k = 0..7). Per target:
  true full run  = R_exp(best batch) from the closed-form expected loss (what the best config needs),
  cost (tool)    = `probe_cost.ratio` of --json: probe samples / the tool's own estimate of one full
                   run at its recommendation (R(B0) extrapolated from the trunk when it stops short),
  cost (truth)   = probe samples / R_exp(recommended batch),
  regret         = T(recommended) / T(best), as benchmarks/branched_cost.py (closed-form R, the grid's
                   simulated throughput).
Then, at loss 0.5 (a run of ~168 steps, where the probe costs under one run), the same 8 seeds with
two confirmation seeds instead of three (branch.confirm_seeds = 2), with windows of at least 8 of a
batch's own steps (branch.min_steps = 8) and with a checkpoint at 0 (branches from initialisation):
which evidence stops the probe adopting 512, at what cost?
Simulated seconds; deterministic per seed.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from branched_cost import tune_json  # noqa: E402
from regret_cases import _nqm_true_r  # noqa: E402

from batchtune.recipe.load import load_recipe  # noqa: E402

TARGETS = [1.0, 0.7, 0.5, 0.4, 0.3, 0.25]
SETTING = [
    "probe.mode=branched",
    "branch.trunk_samples=2048",
    "branch.checkpoints=[0.5, 1.0]",
    "branch.window_samples=1024",
    "branch.max_window_factor=1.5",
]
SEEDS = range(8)
MORE = sys.argv[1:]  # further `--set`s for every row, e.g. branch.confirm_rejections=true
VARIANT_TARGET = 0.5
VARIANTS = {
    "shipped (confirm_seeds 3, max_seeds 4, min_steps 4)": [],
    "confirm_seeds 2 (the default before)": ["branch.confirm_seeds=2"],
    "min_steps 8": ["branch.min_steps=8"],
    "checkpoints 0, 0.5, 1.0": ["branch.checkpoints=[0, 0.5, 1.0]"],
}


def true_r(batch: int, target: float) -> float:
    """The closed form's samples to ``target`` at ``batch`` (regret_cases._nqm_true_r on the recipe)."""
    return _nqm_true_r(load_recipe("recipes/nqm.toml"), batch, target)


def grid_throughput() -> dict[str, tuple[int, float]]:
    """Each candidate's (batch, responses/s) from the grid probe's recommendation (the simulated time
    model; the same for every target)."""
    grid = tune_json(["probe.mode=grid"])
    assert grid is not None, "the grid probe failed"
    return {c["name"]: (c["batch_responses"], c["responses_per_s"]) for c in grid["candidates"]}


def main() -> None:
    t0 = time.perf_counter()
    thr = grid_throughput()
    print(f"# setting: {' '.join([*SETTING, *MORE])}; seeds {list(SEEDS)} one at a time")
    print(
        "target | R(8) true | best | true full run (steps) | cost tool: median [max] | "
        "cost truth: median [max] | regret: median [max] | n regret<=1.05 | recommendations"
    )
    for target in TARGETS:
        r = {name: true_r(n, target) for name, (n, _) in thr.items()}
        t = {name: r[name] / thr[name][1] for name in thr}
        best = min(t, key=lambda k: t[k])
        tool, truth, regret, recs = [], [], [], []
        for seed in SEEDS:
            d = tune_json([*SETTING, *MORE, f"target.value={target}", f"budget.seeds=[{seed}]"])
            if d is None:
                tool.append(math.inf)
                truth.append(math.inf)
                regret.append(math.inf)
                recs.append("fail")
                continue
            rec = d["recommended"]["name"]
            tool.append(d["probe_cost"]["ratio"])
            truth.append(d["probe_cost"]["samples"] / r[rec])
            regret.append(t[rec] / t[best])
            recs.append(rec)

        def med_max(xs: list[float]) -> str:
            return f"{statistics.median(xs):.2f} [{max(xs):.2f}]"

        steps = r[best] / thr[best][0]
        print(
            f"{target} | {r['P1xG8']:,.0f} | {best} | {r[best]:,.0f} ({steps:.0f}) | {med_max(tool)} | "
            f"{med_max(truth)} | {statistics.median(regret):.3f} [{max(regret):.3f}] | "
            f"{sum(x <= 1.05 for x in regret)}/{len(regret)} | {' '.join(recs)}",
            flush=True,
        )
    print()
    print(
        f"## loss {VARIANT_TARGET}: the shipped branch settings, fewer confirmation seeds, longer windows, "
        "a checkpoint at 0"
    )
    print("variant | recommendations (seeds 0-7) | cost truth: median [max] | n regret<=1.05")
    r = {name: true_r(n, VARIANT_TARGET) for name, (n, _) in thr.items()}
    t = {name: r[name] / thr[name][1] for name in thr}
    best = min(t, key=lambda k: t[k])
    for label, extra in VARIANTS.items():
        recs, truth, regret = [], [], []
        for seed in SEEDS:
            sets = [*SETTING, *MORE, *extra, f"target.value={VARIANT_TARGET}", f"budget.seeds=[{seed}]"]
            d = tune_json(sets)
            rec = d["recommended"]["name"] if d else "fail"
            recs.append(rec)
            truth.append(d["probe_cost"]["samples"] / r[rec] if d else math.inf)
            regret.append(t[rec] / t[best] if d else math.inf)
        print(
            f"{label} | {' '.join(recs)} | {statistics.median(truth):.2f} [{max(truth):.2f}] | "
            f"{sum(x <= 1.05 for x in regret)}/{len(regret)}",
            flush=True,
        )
    print(f"# total wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
