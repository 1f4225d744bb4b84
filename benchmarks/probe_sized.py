"""The default probe (probe.mode = "auto") on a long run: what it costs against one full run, at what regret.

    python benchmarks/probe_sized.py > benchmarks/out/probe_sized.txt  # recipes/nqm-long.toml
    python benchmarks/probe_sized.py --tiny N > benchmarks/out/probe_sized_tiny.txt  # tiny-grpo-long
    python benchmarks/probe_sized.py --sets 4 --set nqm.dim=2000 --set budget.full_run_steps=1887 \
        [--set branch.size_to_run=true] > benchmarks/out/probe_sized_dim2000.txt  # a 2.2x longer run

Each row is `batchtune tune RECIPE --json` as a user runs it (the recipe as shipped, nothing set but
`budget.seeds`), in a fresh results directory; the recipe states its full run, so "auto" chooses the
probe (the first line says which, from `batchtune plan --json`). Per seed set:
  cost (truth) = probe samples / the true samples to the target at the recommended batch,
  cost (tool)  = `probe_cost.ratio` of --json (over the tool's own estimate of that full run),
  regret       = T(recommended) / T(best), T(B) = true R(B) / Θ(B), Θ from the simulation's own time
                 model (NQM; benchmarks/regret_cases.nqm_true_step_s) or the responses/s the first
                 row's profile measured (tiny-grpo).
The grid is not run here (on nqm-long it is 24 runs of up to 524k samples each, too slow for this
machine); `plan` puts it at about 24x one full run, as the first line says.
Truth. NQM: R(B) from the closed form of the expected loss (backends/nqm_theory). tiny-grpo: every
candidate run to the target at seeds 10, 11, 12 (no band stop; benchmarks/regret_tiny.exhaustive_truth,
cached under benchmarks/cache/), R(B) the median over them.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]


def cli_json(command: str, recipe: Path, sets: list[str], *extra: str) -> dict[str, Any] | None:
    """`batchtune COMMAND RECIPE --json --set ...` in a fresh results dir; None if it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["batchtune", command, str(recipe), "--json", "--results", tmp, *extra]
        for s in sets:
            argv += ["--set", s]
        out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _sets() -> list[str]:
    """The `--set KEY=VALUE` arguments given to this script, passed to every command (and the truth)."""
    return [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--set"]


def nqm_truth(recipe: Path) -> dict[int, float]:
    from regret_cases import _nqm_true_r

    from batchtune.recipe.load import load_recipe

    cfg = load_recipe(recipe, _sets())
    g = cfg.candidates.group_size
    return {p * g: _nqm_true_r(cfg, p * g) for p in cfg.candidates.prompts}


def nqm_throughput(recipe: Path) -> dict[int, float]:
    """Responses/s per batch from the simulation's own time model (regret_cases.nqm_true_step_s)."""
    from regret_cases import nqm_true_step_s

    from batchtune.recipe.load import load_recipe

    cfg = load_recipe(recipe, _sets())
    g = cfg.candidates.group_size
    return {p * g: p * g / nqm_true_step_s(cfg, p * g) for p in cfg.candidates.prompts}


def tiny_truth(name: str) -> dict[int, float]:
    from regret_tiny import exhaustive_truth

    eff = exhaustive_truth(name, [10, 11, 12])
    return {
        c.batch_responses: c.estimate.samples_to_target if c.estimate else math.inf
        for c in eff.candidates
        if c.family == "main"
    }


def main() -> None:
    tiny = "--tiny" in sys.argv
    n_sets = int(sys.argv[sys.argv.index("--tiny") + 1]) if tiny else 8
    if "--sets" in sys.argv:
        n_sets = int(sys.argv[sys.argv.index("--sets") + 1])
    name = "tiny-grpo-long" if tiny else "nqm-long"
    recipe = ROOT / "recipes" / f"{name}.toml"
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    plan = cli_json("plan", recipe, _sets(), "--time-steps", "0")
    truth = tiny_truth(name) if tiny else nqm_truth(recipe)
    cores = os.cpu_count()
    given = "".join(f" --set {x}" for x in _sets())
    print(f"# batchtune tune recipes/{name}.toml{given} --set budget.seeds=[...]; {cores} cores, ", end="")
    print(f"load {load:.1f}")
    print(f"# plan: {plan['probe_choice'] if plan else 'failed'}")
    print("# true R(B): " + ", ".join(f"{b}: {r:,.0f}" for b, r in sorted(truth.items())))
    rows: list[tuple[str, dict[str, Any] | None]] = []
    for k in range(n_sets):
        seeds = [3 * k, 3 * k + 1, 3 * k + 2]
        rows.append((f"auto, seeds {seeds}", cli_json("tune", recipe, [*_sets(), f"budget.seeds={seeds}"])))
    thr_src = next(d for _, d in rows if d is not None)
    batch_of = {c["name"]: c["batch_responses"] for c in thr_src["candidates"]}
    thr = (
        nqm_throughput(recipe)
        if not tiny
        else {c["batch_responses"]: c["responses_per_s"] for c in thr_src["candidates"]}
    )
    t = {b: truth[b] / thr[b] for b in thr}
    best = min(t, key=lambda b: t[b])
    print(f"# best batch {best}: {truth[best]:,.0f} samples = {truth[best] / best:.0f} steps")
    print("row | pick | probe samples | cost truth | cost tool | regret")
    regrets, costs = [], []
    for label, d in rows:
        if d is None:
            print(f"{label} | failed")
            continue
        n = batch_of[d["recommended"]["name"]]
        spent = d["probe_cost"]["samples"]
        cost, regret = spent / truth[n], t[n] / t[best]
        if label.startswith("auto"):
            regrets.append(regret)
            costs.append(cost)
        print(
            f"{label} | {d['recommended']['name']} | {spent:,} | {cost:.3f}x | "
            f"{d['probe_cost']['ratio']:.3f}x | {regret:.3f}",
            flush=True,
        )
    if costs:
        print(
            f"# auto over {len(costs)} seed sets: cost truth median {statistics.median(costs):.3f}x, max "
            f"{max(costs):.3f}x; regret max {max(regrets):.3f}, <= 1.05 on {sum(r <= 1.05 for r in regrets)}"
            f"/{len(regrets)}; total wall {time.perf_counter() - t0:.0f} s, "
            f"load {os.getloadavg()[0]:.1f} at end"
        )


if __name__ == "__main__":
    main()
