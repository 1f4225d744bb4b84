"""Benchmark: probes on a local Ray (1 and 2 runs in flight) against the local executor.

    python benchmarks/ray_probe.py [--recipes nqm,tiny-grpo] > benchmarks/out/ray_probe.txt

Each recipe is probed four times into a fresh results directory: the local executor with
``run.workers`` 1 and 2 (in-process / a pool of processes), and ``run.executor = "ray"`` with
``run.workers`` 1 and 2 (Ray tasks, one CPU each) on one local Ray of 2 CPUs started once (its start
is timed on its own). Prints each probe's answer (critical batch, each candidate's status and
per-seed samples-to-target) with whether it is identical to the first local probe, a table of wall
times, and one JSON line whose keys carry their units. The machine's load average is printed too:
wall times on a shared machine are only comparable within one run of this script.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import ray

from batchtune.measure.probe import run_probe
from batchtune.recipe.load import load_recipe, shipped_recipes

CONFIGS = (("local", 1), ("local", 2), ("ray", 1), ("ray", 2))


def _answer(result) -> dict:
    """The probe's answer: the critical batch, and each candidate's verdict and per-seed R."""
    eff = result.efficiency
    return {
        "critical_batch": eff.critical.batch if eff.critical else None,
        "candidates": {
            c.label: (c.status, list(c.estimate.per_seed) if c.estimate else None) for c in eff.candidates
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default="nqm,tiny-grpo")
    args = parser.parse_args()
    print(f"cpu cores {os.cpu_count()}, load average before {os.getloadavg()[0]:.1f}, ray {ray.__version__}")
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    out: dict[str, float | bool | str] = {"ray_init_s": round(time.perf_counter() - t0, 2)}
    rows = []
    for name in args.recipes.split(","):
        path = shipped_recipes()[name]
        first = None
        for executor, workers in CONFIGS:
            with tempfile.TemporaryDirectory(prefix="bt-ray-bench-") as tmp:
                overrides = [f"run.executor={executor}", f"run.workers={workers}", f'run.results_dir="{tmp}"']
                recipe = load_recipe(path, overrides)
                t = time.perf_counter()
                result = run_probe(recipe)
                wall = time.perf_counter() - t
            answer = _answer(result)
            first = first or answer
            same = answer == first
            key = f"{name}_{executor}_{workers}w"
            out[f"{key}_wall_s"] = round(wall, 1)
            out[f"{key}_identical"] = same
            rows.append((name, executor, workers, wall, result.runs_done, answer["critical_batch"], same))
            print(f"{key}: critical batch {answer['critical_batch']}, identical to local 1w: {same}")
            for label, (status, r) in answer["candidates"].items():
                print(f"    {label:<10} {status:<12} R per seed {r}")
    ray.shutdown()
    print(f"\n{'recipe':<10}{'executor':<10}{'workers':>8}{'wall s':>9}{'runs':>6}{'B_crit':>8}  identical")
    for name, executor, workers, wall, runs, crit, same in rows:
        print(f"{name:<10}{executor:<10}{workers:>8}{wall:>9.1f}{runs:>6}{crit!s:>8}  {same}")
    print(f"ray start (once): {out['ray_init_s']} s; load average after {os.getloadavg()[0]:.1f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
