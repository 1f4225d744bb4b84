"""Benchmark: the generation/training profile of a recipe (default: recipes/tiny-profile.toml, CPU).

    python benchmarks/bench_profile.py [RECIPE] [--set key=value ...]

Runs ``run_profile`` into a fresh temporary results directory (warm-up calls excluded, the median
of the timed repeats reported), then prints one table per mode, the wall time with the machine's
load average before and after, and one JSON line whose keys carry their units. Nothing here is
simulated: every figure is measured on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from batchtune.measure.profile import run_profile
from batchtune.recipe.load import load_recipe
from batchtune.records.store import ResultsStore

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default=str(ROOT / "recipes" / "tiny-profile.toml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe, args.overrides)

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bt-bench-") as tmp:
        start = time.perf_counter()
        result = run_profile(recipe, ResultsStore(tmp))
        wall_s = time.perf_counter() - start
    load_after = os.getloadavg()[0]

    print(f"profile {result.profile_id}: {result.model} on {result.device} ({result.backend})")
    summary: dict[str, object] = {
        "recipe": Path(args.recipe).name,
        "device": result.device,
        "backend": result.backend,
        "wall_s": round(wall_s, 2),
    }
    for mode, m in result.modes.items():
        print(f"\n{mode}: concurrency  responses_per_s  output_tokens_per_s  batch_s (+-spread)  mean_tokens")
        for p in m.points:
            if p.status != "ok":
                print(f"{p.concurrency:>17}  {p.status}: {p.message}")
                continue
            print(
                f"{p.concurrency:>17}  {p.responses_per_s:>15.1f}  {p.output_tokens_per_s:>19.1f}  "
                f"{p.step_latency_s:>8.4f} (+-{p.step_latency_spread_s:.4f})  {p.mean_output_tokens:>11.1f}"
            )
        knee = m.knee
        print(f"knee: {knee.concurrency:g} ({knee.reason})" if knee else f"knee: none ({m.note})")
        summary[f"responses_per_s_{mode}"] = {
            str(p.concurrency): round(p.responses_per_s, 2) for p in m.ok_points
        }
        summary[f"knee_{mode}_concurrency"] = knee.concurrency if knee else None
        summary[f"knee_{mode}_saturated"] = knee.saturated if knee else None
        summary[f"knee_{mode}_fraction_of_bound"] = m.knee_fraction_of_bound
        summary[f"ceiling_{mode}_concurrency"] = m.ceiling
    print("\ntrain: batch  step_s (+-spread)")
    for p in result.train_points:
        extra = f"  {p.status}: {p.message}" if p.status != "ok" else ""
        print(f"{p.concurrency:>12}  {p.step_latency_s:.4f} (+-{p.step_latency_spread_s:.4f}){extra}")
    summary["train_step_s"] = {
        str(p.concurrency): round(p.step_latency_s, 5) for p in result.train_points if p.status == "ok"
    }
    if result.roofline_note:
        print(f"\n{result.roofline_note}")
    print(
        f"\nwall: {wall_s:.1f} s; {os.cpu_count()} CPU cores shared, 1-min load average "
        f"{load_before:.1f} before, {load_after:.1f} after"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
