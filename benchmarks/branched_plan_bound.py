"""How far `batchtune plan`'s bound on a branched probe sits above what the probe then spends.

For each setting: `batchtune plan RECIPE --set probe.mode=branched ... --json` (the bound, from the
recipe alone), then `batchtune probe` of the same recipe in a fresh results directory (what it
spent, `probe_cost.samples`). The bound must hold on every row; the ratio says how loose it is.

    python benchmarks/branched_plan_bound.py > benchmarks/out/branched_plan_bound.txt
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time

SETTINGS: list[tuple[str, list[str]]] = [
    ("recipes/nqm.toml", ["budget.seeds=[0, 1, 2]"]),
    ("recipes/nqm.toml", ["budget.seeds=[3, 4, 5]"]),
    ("recipes/nqm.toml", ["budget.seeds=[6, 7, 8]"]),
    ("recipes/nqm.toml", ["branch.search=all"]),
    ("recipes/nqm.toml", ["branch.trunk_samples=1024", "branch.checkpoints=[1.0]", "budget.seeds=[0]"]),
    ("recipes/tiny-grpo.toml", []),
    ("recipes/tiny-ppo.toml", []),
]


def run_json(argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "batchtune", *argv, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"batchtune {' '.join(argv)} failed ({out.returncode}): {out.stderr[-1500:]}")
    return json.loads(out.stdout)


def main() -> int:
    t0 = time.perf_counter()
    print(f"# {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}")
    print("recipe | settings | plan: samples at most | probe: samples spent | spent / bound | grid at most")
    ok = True
    for recipe, sets in SETTINGS:
        args = [a for s in ["probe.mode=branched", *sets] for a in ("--set", s)]
        with tempfile.TemporaryDirectory() as tmp:
            plan = run_json(["plan", recipe, "-r", f"{tmp}/r", *args])
            spent = run_json(["probe", recipe, "-r", f"{tmp}/r", *args])["probe_cost"]["samples"]
        bound = plan["total_samples_max"]
        ok &= spent <= bound
        shown = " ".join(sets) or "(branch defaults)"
        print(
            f"{recipe} | {shown} | {bound:,} | {spent:,} | {spent / bound:.2f} | {plan['grid_samples_max']:,}"
        )
    print(
        f"# bound held on {'every' if ok else 'NOT every'} row; total wall {time.perf_counter() - t0:.0f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
