"""What a branched probe costs and how good its answer is, on the NQM (recipes/nqm.toml).

    python benchmarks/branched_cost.py > benchmarks/out/branched_cost.txt
    python benchmarks/branched_cost.py --seed-pairs > benchmarks/out/branched_cost_seeds.txt

For each setting: `batchtune tune recipes/nqm.toml` with probe.mode = branched (fresh results dir),
then
  cost   = probe samples / one full run at the recommendation (the `probe_cost.ratio` of --json),
  regret = T(recommended) / T(best), T(B) = R_exp(B) / Θ(B): R_exp from the closed-form expected SGD
           loss (backends.nqm_theory.expected_samples_to_target), Θ(B) the recommendation's own
           throughput model in the grid row (the simulated time model), best over the candidate batches.
  runner-up = the candidate with the next least time by the tool's own estimate, and that time over
           the pick's (how close the call was); "(bound)" when a seed or branch of it never reached
           the target, so that its time is a lower bound and ranks at the point x (1+tol).
The grid probe (probe.mode = grid) is the baseline row. Simulated seconds; deterministic per seed.
--seed-pairs: the cheapest setting (one checkpoint of a 1536-sample trunk, W 1024, max window 1.5x,
two seeds) at four seed pairs, to show how the answer varies with the seeds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from typing import Any

from regret_cases import _nqm_true_r

from batchtune.recipe.load import load_recipe

SETTINGS = {
    "grid (baseline)": ["probe.mode=grid"],
    "branched W=1024, ckpts 0.5/1.0 of 3072": [
        "branch.trunk_samples=3072",
        "branch.window_samples=1024",
        "branch.checkpoints=[0.5, 1.0]",
    ],
    "branched W=2048, ckpts 0.5/1.0 of 3072": [
        "branch.trunk_samples=3072",
        "branch.window_samples=2048",
        "branch.checkpoints=[0.5, 1.0]",
    ],
    "branched W=1024, ckpt 1.0 of 2048, 2 seeds": [
        "branch.trunk_samples=2048",
        "branch.window_samples=1024",
        "branch.checkpoints=[1.0]",
        "budget.seeds=[0, 1]",
    ],
    "branched W=1024, ckpts .25/.5/1 of 4096": [
        "branch.trunk_samples=4096",
        "branch.window_samples=1024",
        "branch.checkpoints=[0.25, 0.5, 1.0]",
    ],
}


CHEAPEST = [
    "branch.trunk_samples=1536",
    "branch.window_samples=1024",
    "branch.checkpoints=[1.0]",
    "branch.max_window_factor=1.5",
]
SEED_PAIRS = {
    "grid (baseline)": ["probe.mode=grid"],
    **{
        f"cheapest, seeds {a},{b}": [*CHEAPEST, f"budget.seeds=[{a}, {b}]"]
        for a, b in ((0, 1), (2, 3), (4, 5), (6, 7))
    },
}


def tune_json(sets: list[str]) -> dict[str, Any] | None:
    """`batchtune tune recipes/nqm.toml --json --set ...` in a fresh results dir; None if it failed."""
    return cli_json("tune", sets)


def cli_json(command: str, sets: list[str]) -> dict[str, Any] | None:
    """`batchtune COMMAND recipes/nqm.toml --json --set ...` in a fresh results dir; None if it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["batchtune", command, "recipes/nqm.toml", "--json", "--results", tmp]
        for s in sets:
            argv += ["--set", s]
        out = subprocess.run(argv, capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else None


def true_times(grid: dict[str, Any]) -> dict[str, float]:
    """T(B) per candidate of a grid row's --json: R_exp(B) from the closed form / its throughput."""
    base = load_recipe("recipes/nqm.toml")
    return {
        c["name"]: _nqm_true_r(base, c["batch_responses"]) / c["responses_per_s"] for c in grid["candidates"]
    }


def main() -> None:
    t: dict[str, float] = {}
    settings = SEED_PAIRS if "--seed-pairs" in sys.argv[1:] else SETTINGS
    print(
        "setting | recommended | probe samples | full run at rec. | cost (x full run) | regret | "
        "runner-up: tool's time / pick's | wall s"
    )
    for name, sets in settings.items():
        sets = sets if sets[0].startswith("probe.mode") else ["probe.mode=branched", *sets]
        d = tune_json(sets)
        if d is None:
            raise SystemExit(f"batchtune tune failed for {name}")
        cost = d["probe_cost"]
        if not t:  # the grid row: every candidate's throughput (the same time model for all rows)
            t = true_times(d)
        best = min(v for v in t.values() if math.isfinite(v))
        rec = d["recommended"]["name"]
        times = {c["name"]: c["time_to_target_s"] for c in d["candidates"] if c.get("time_to_target_s")}
        up = min((k for k in times if k != rec), key=lambda k: times[k])
        bound = " (bound)" if any(c["name"] == up and c.get("n_censored") for c in d["candidates"]) else ""
        print(
            f"{name} | {rec} | {cost['samples']:,} | {cost['full_run_samples']:,.0f} | "
            f"{cost['ratio']:.2f} | {t[rec] / best:.3f} | {up} {times[up] / times[rec]:.3f}{bound} | "
            f"{cost['wall_s']:.1f}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
