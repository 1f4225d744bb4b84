"""Benchmark: what the probe and the analysis cost, measured side by side in one run.

    python benchmarks/bench_probe.py [--repeats 3]

1. The NQM probe (recipes/nqm.toml, a simulation: 8 batches x 3 seeds) with 1 and with 2 local
   worker processes, fresh results directory each time: wall seconds, median over repeats.
2. Resuming a finished probe (every run reused): the cost of the bookkeeping alone.
3. `recommend` from the records on disk (analysis only, no engine).
Prints a table and one JSON line whose keys carry their units.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from batchtune.measure.probe import analyse_store, run_probe
from batchtune.recipe.load import load_recipe
from batchtune.records.store import ResultsStore
from batchtune.workflow.recommend import recommend_for_recipe

ROOT = Path(__file__).resolve().parents[1]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    recipe_path = ROOT / "recipes" / "nqm.toml"
    times: dict[str, list[float]] = {
        "probe_1_worker_s": [],
        "probe_2_workers_s": [],
        "resume_s": [],
        "analyse_s": [],
        "recommend_s": [],
    }
    for _ in range(args.repeats):
        for workers, key in ((1, "probe_1_worker_s"), (2, "probe_2_workers_s")):
            with tempfile.TemporaryDirectory(prefix="bt-bench-") as tmp:
                recipe = load_recipe(recipe_path, [f"run.workers={workers}", f'run.results_dir="{tmp}"'])
                times[key].append(_timed(lambda r=recipe: run_probe(r)))
                if workers == 1:
                    times["resume_s"].append(_timed(lambda r=recipe: run_probe(r)))
                    store = ResultsStore(tmp)
                    times["analyse_s"].append(_timed(lambda r=recipe, s=store: analyse_store(s, r)))
                    times["recommend_s"].append(
                        _timed(lambda r=recipe: recommend_for_recipe(r, "probe", None, 8))
                    )
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{'what':<28}{'median s':>10}   (n={args.repeats})")
    for key, value in med.items():
        print(f"{key:<28}{value:>10.3f}")
    ratio = med["probe_1_worker_s"] / med["probe_2_workers_s"]
    print(f"{'speed-up with 2 workers':<28}{ratio:>10.2f}x")
    print(
        json.dumps(
            {
                "bench": "probe",
                "recipe": "nqm.toml",
                "repeats": args.repeats,
                **{k: round(v, 4) for k, v in med.items()},
                "speedup_2_workers_ratio": round(ratio, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
