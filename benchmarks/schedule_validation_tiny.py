"""Validate batch schedules on the real GRPO trainer (recipes/tiny-grpo.toml): run them to the target.

    python benchmarks/schedule_validation_tiny.py > benchmarks/out/schedule_validation_tiny.txt

`batchtune tune recipes/tiny-grpo.toml --json` with a branched probe (trunk 2048, checkpoints at
0.5 and 1.0, windows of 1024; fresh results dir) gives the planned schedule (`batch_schedule`) and
the ranking's winner. Then measure/schedule_run.py runs, at seeds 100-104 (not the probe's), each to
the target (held-out reward 0.9, evaluated every 128 responses): the planned schedule, the fixed
batches it names, the reference batch, and hand-made Merrill-style warmups (each stage resumed from
the last one's checkpoint: weights, optimiser moments, prompt position, RNG). Measured: responses,
optimiser steps and CPU seconds of generation + training to the target (isotonic crossing; means
over the seeds that reached it). One process, runs one after another, on this 2-core box.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from schedule_validation import measure

from batchtune.recipe.load import load_recipe

RECIPE = "recipes/tiny-grpo.toml"
RUN_SETS = ["task.eval_every_samples=128"]
PROBE_SETS = [
    'probe.mode="branched"',
    *RUN_SETS,
    "branch.trunk_samples=2048",
    "branch.checkpoints=[0.5, 1.0]",
    "branch.window_samples=1024",
]
SEEDS = [100, 101, 102, 103, 104]
MANUAL = [
    [("P2xG8", 1024), ("P8xG8", 0)],
    [("P4xG8", 2048), ("P16xG8", 0)],
    [("P2xG8", 1024), ("P4xG8", 2048), ("P8xG8", 0)],
]


def _num(x: object, digits: int) -> str:
    return f"{x:,.{digits}f}" if isinstance(x, (int, float)) else str(x)


def main() -> None:
    t0 = time.perf_counter()
    print(f"# x86_64, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start; seeds {SEEDS}")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["batchtune", "tune", RECIPE, "--json", "--results", f"{tmp}/probe"]
        for s in PROBE_SETS:
            argv += ["--set", s]
        d = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
        recipe = load_recipe(RECIPE, RUN_SETS)
        sched = d.get("batch_schedule") or {}
        winner = d["recommended"]["name"]
        rows: dict[str, tuple[list[tuple[str, float]], dict | None]] = {}
        if sched.get("stages"):
            stages = [(st["name"], st["end_samples"]) for st in sched["stages"]]
            rows["planned schedule " + " -> ".join(n for n, _ in stages)] = (stages, sched.get("schedule"))
        fixed_pred = sched.get("fixed") or {}
        best_fixed = (sched.get("best_fixed") or {}).get("name")
        for fixed in dict.fromkeys([winner, *([best_fixed] if best_fixed else []), "P2xG8", "P16xG8"]):
            rows[f"fixed {fixed}"] = ([(fixed, 0.0)], fixed_pred.get(fixed))
        for manual in MANUAL:
            name = " -> ".join(f"{n}" + (f" @{e}" if e else "") for n, e in manual)
            rows[f"manual {name}"] = (manual, None)
        cost = d["probe_cost"]
        print(f"probe (branched): {cost['samples']:,} samples; ranking winner {winner}")
        print(f"schedule: {sched.get('verdict', 'none planned')}")
        print("plan | predicted: samples | steps | measured: samples (sd) | steps | cpu s (sd) | reached")
        for i, (label, (st, pred)) in enumerate(rows.items()):
            m = measure(recipe, f"{tmp}/runs", st, f"p{i}", SEEDS)
            out.append({"plan": label, "predicted": pred, "measured": m})
            meas = (
                f"{m['samples']:,.0f} ({m['samples_sd']:,.0f}) | {m['steps']:,.1f} | "
                f"{m['time_s']:.1f} ({m['time_sd']:.1f})"
                if m["reached"]
                else "- | - | -"
            )
            p = f"{_num(pred.get('samples'), 0)} | {_num(pred.get('steps'), 1)}" if pred else "- | -"
            print(f"{label} | {p} | {meas} | {m['reached']}/{len(SEEDS)}")
            sys.stdout.flush()
    print(f"# total wall {time.perf_counter() - t0:.0f} s")
    print(json.dumps({"schedule_validation_tiny": out}))


if __name__ == "__main__":
    main()
