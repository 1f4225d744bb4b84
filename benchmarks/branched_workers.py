"""A branched probe with run.workers = 1 and 2, side by side: wall time and the same answer.

Runs `batchtune probe RECIPE --set probe.mode=branched` as a user does, each time in a fresh results
directory, alternating workers 1 and 2 (pair by pair, so the ratio holds when the machine's speed
drifts), and prints each pair's wall seconds and ratio, the medians, and whether the two answers
are the same (the probe's JSON less its wall-clock fields; the runs are deterministic per seed, so
the curves, the local critical batches and the cost must agree exactly).

    python benchmarks/branched_workers.py [RECIPE] [--pairs 3] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from batchtune.measure.branched import branched_store


def without_wall(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: without_wall(x) for k, x in v.items() if "wall" not in k and k != "results_dir"}
    return [without_wall(x) for x in v] if isinstance(v, list) else v


def probe(recipe: str, workers: int, sets: list[str]) -> tuple[float, float, dict]:
    """Wall seconds of the whole command, of its trunk (which runs alone), and the probe's JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "batchtune", "probe", recipe, "-r", f"{tmp}/r", "--json"]
        cmd += ["--set", "probe.mode=branched", "--set", f"run.workers={workers}", *sets]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-1500:]}")
        trunk = sum(r.wall_s for r in branched_store(f"{tmp}/r").runs() if r.run_id.startswith("trunk-"))
    return wall, trunk, json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default="recipes/tiny-grpo.toml")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    sets = [x for o in args.overrides for x in ("--set", o)]
    load0 = os.getloadavg()[0]
    head = f"# batchtune probe {args.recipe} --set probe.mode=branched --set run.workers=W {' '.join(sets)}"
    print(head.rstrip())
    where = f"{platform.machine()}, {os.cpu_count()} cores"
    print(f"# {where}, load {load0:.1f} at start; Python {platform.python_version()}")
    print("pair | workers 1 wall s | workers 2 wall s | ratio 1/2 | trunk s (alone, workers 2) | same answer")
    ratios, w1s, w2s, trunks = [], [], [], []
    answers = []
    for i in range(args.pairs):
        a, _, ja = probe(args.recipe, 1, sets)
        b, tb, jb = probe(args.recipe, 2, sets)
        same = without_wall(ja) == without_wall(jb)
        answers.append((ja, same))
        ratios.append(a / b)
        w1s.append(a)
        w2s.append(b)
        trunks.append(tb)
        print(f"{i + 1} | {a:.1f} | {b:.1f} | {a / b:.2f} | {tb:.1f} | {'yes' if same else 'NO'}")
    print(
        f"median | {statistics.median(w1s):.1f} | {statistics.median(w2s):.1f} | "
        f"{statistics.median(ratios):.2f} | {statistics.median(trunks):.1f} | "
        f"{sum(s for _, s in answers)}/{len(answers)}"
    )
    ja = answers[0][0]
    crit = ja["critical_training_batch"] or {}
    cost = ja["probe_cost"]
    print(
        f"# answer: critical batch {crit.get('batch_responses')}, probe samples {cost['samples']:,}, "
        f"runs {ja['runs_done']}; load {os.getloadavg()[0]:.1f} at the end"
    )
    return 0 if all(s for _, s in answers) else 1


if __name__ == "__main__":
    sys.exit(main())
