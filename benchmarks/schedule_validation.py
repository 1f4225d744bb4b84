"""Validate the batch schedule by running it: the schedule `recommend` plans from a branched probe
against the best fixed batch, each run to the target on the NQM at fresh seeds.

    python benchmarks/schedule_validation.py > benchmarks/out/schedule_validation.txt

Per instance: `batchtune tune RECIPE --json` with a branched probe (fresh results dir) gives the
predicted schedule (`batch_schedule`: stages keyed in samples, LR by the recipe's rule) and the
ranking's winner; then measure/schedule_run.py runs the schedule (each stage resumed from the last
stage's checkpoint) and the fixed batches (the ranking's winner and the schedule model's best fixed)
to the target at seeds 100-104 (not the probe's). Measured: samples, optimiser steps and simulated
seconds to the target (isotonic crossing; mean over seeds). Simulated seconds from the NQM time
model; deterministic per seed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import numpy as np

from batchtune.measure.plan import plan_candidates
from batchtune.measure.schedule_run import run_schedule
from batchtune.recipe.load import load_recipe

BRANCHED = ["probe.mode=branched"]
INSTANCES = {
    "nqm.toml as shipped (critical batch falls towards the target)": [
        *BRANCHED,
        "branch.trunk_samples=3072",
        "branch.window_samples=1024",
        "branch.checkpoints=[0.5, 1.0]",
    ],
    "nqm h_i=1/i^2, noise 1, lr 0.01, target 0.05 (critical batch grows early)": [
        *BRANCHED,
        "nqm.curvature_power=2.0",
        "nqm.noise_scale=1.0",
        "optimizer.lr=0.01",
        "target.value=0.05",
        "budget.max_samples=120000",
        "branch.trunk_samples=8192",
        "branch.window_samples=2048",
        "branch.checkpoints=[0.0625, 0.25, 1.0]",
    ],
}
SEEDS = [100, 101, 102, 103, 104]
# Merrill-style warmups by hand (stage ends in samples), run beside the planned ones
MANUAL = {
    list(INSTANCES)[1]: [
        [("P16xG8", 1024), ("P64xG8", 4096), ("P128xG8", 0)],
        [("P32xG8", 2048), ("P128xG8", 0)],
    ],
    list(INSTANCES)[0]: [[("P8xG8", 1024), ("P32xG8", 0)]],
}


def measure(
    recipe, results: str, plan_stages: list[tuple[str, float]], tag: str, seeds: list[int] = SEEDS
) -> dict[str, float]:
    """Run the chain of (label, end samples) stages to the target at every seed; means (and sds) over
    the seeds that reached it (benchmarks/schedule_validation_tiny.py uses it too)."""
    plan = plan_candidates(recipe)
    by = plan.by_label()
    stages = [(by[label], int(np.ceil(end))) for label, end in plan_stages]
    ref = plan.reference_batch
    runs = [run_schedule(recipe, results, stages, s, reference_batch=ref, tag=tag) for s in seeds]
    hit = [r for r in runs if r.samples_to_target is not None]
    if not hit:
        return {"reached": 0}
    return {
        "reached": len(hit),
        "samples": float(np.mean([r.samples_to_target for r in hit])),
        "samples_sd": float(np.std([r.samples_to_target for r in hit])),
        "steps": float(np.mean([r.steps_to_target for r in hit])),
        "time_s": float(np.mean([r.time_to_target_s for r in hit])),
        "time_sd": float(np.std([r.time_to_target_s for r in hit])),
    }


def main() -> None:
    out = []
    for name, sets in INSTANCES.items():
        with tempfile.TemporaryDirectory() as tmp:
            argv = ["batchtune", "tune", "recipes/nqm.toml", "--json", "--results", f"{tmp}/probe"]
            for s in sets:
                argv += ["--set", s]
            d = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
            sched = d["batch_schedule"]
            recipe = load_recipe("recipes/nqm.toml", sets)
            stages = [(st["name"], st["end_samples"]) for st in sched["stages"]]
            winner = d["recommended"]["name"]
            rows = {"schedule " + " -> ".join(n for n, _ in stages): (stages, sched["schedule"])}
            for fixed in dict.fromkeys([winner, sched["best_fixed"]["name"]]):
                rows[f"fixed {fixed}"] = ([(fixed, 0.0)], sched["fixed"][fixed])
            for manual in MANUAL.get(name, []):  # a hand-made warmup: the machinery on >= 2 stages
                rows["manual " + " -> ".join(n for n, _ in manual)] = (manual, None)
            print(f"## {name}")
            print(
                f"probe: {d['probe_cost']['samples']:,} samples; ranking winner {winner}; {sched['verdict']}"
            )
            print(
                "plan | predicted: samples | steps | sim s | measured: samples | steps | sim s (sd) | reached"
            )
            for label, (st, pred) in rows.items():
                m = measure(recipe, f"{tmp}/runs", st, label.split()[0] + str(len(out)))
                out.append({"instance": name, "plan": label, "predicted": pred, "measured": m})
                meas = (
                    f"{m['samples']:,.0f} | {m['steps']:,.1f} | {m['time_s']:,.1f} ({m['time_sd']:.1f})"
                    if m["reached"]
                    else "- | - | -"
                )
                p = (
                    f"{pred['samples']:,.0f} | {pred['steps']:,.1f} | {pred['time_s']:,.1f}"
                    if pred
                    else "- | - | -"
                )
                print(f"{label} | {p} | {meas} | {m['reached']}/{len(SEEDS)}")
            print()
    print(json.dumps({"schedule_validation": out}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
