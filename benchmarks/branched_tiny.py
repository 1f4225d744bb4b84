"""Branched probes on the real trainer (tiny-grpo, tiny-ppo): cost and regret against exhaustive runs.

    python benchmarks/branched_tiny.py > benchmarks/out/branched_tiny.txt
    python benchmarks/branched_tiny.py tiny-ppo > benchmarks/out/branched_tiny_ppo.txt
    python benchmarks/branched_tiny.py [tiny-ppo] --seeds 3,4,5 >> benchmarks/out/branched_tiny_seeds.txt

Truth: every candidate run to the target (no band stop, no sequential seeds, 65,536 samples at most)
at seeds 10, 11, 12 (disjoint from the probes'), cached under benchmarks/cache/<recipe>-exhaustive
(the same truth as benchmarks/regret_tiny.py); true R(B) = the median over those seeds (a seed that
never reaches the target counts as +inf).
Each row: `batchtune tune recipes/<recipe>.toml --json` in a fresh results directory, then
  cost   = probe samples / one full run at the recommendation (`probe_cost.ratio` of --json), with
           its range over the full run's interval (`probe_cost.ratio_range`: a branched probe
           extrapolates R(B0) from its trunk, so its full run can be uncertain by several times),
  regret = T(recommended) / T(best), T(B) = true R(B) / Θ(B), with Θ(B) the responses/s that the
           grid row's profile-gen measured on this machine (one Θ for every row, so regret here is
           the error that comes from the samples axis alone).
The grid probe (the shipped default) is the baseline row. CPU wall seconds on this machine.
--seeds A,B,C: the probes' own seeds instead of the recipe's (budget.seeds), for the grid row and
the branched defaults' row only (how much the answer depends on the probe's seeds).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from regret_tiny import exhaustive_truth

ROOT = Path(__file__).resolve().parents[1]
ARGS = sys.argv[1:]
PROBE_SEEDS = ARGS[ARGS.index("--seeds") + 1] if "--seeds" in ARGS else None
NAME = next((a for a in ARGS if not a.startswith("-") and a != PROBE_SEEDS), "tiny-grpo")
RECIPE = ROOT / "recipes" / f"{NAME}.toml"
TRUTH_SEEDS = [10, 11, 12]

BRANCHED = ['probe.mode="branched"', "task.eval_every_samples=128"]
SETTINGS = {
    "grid (the shipped default)": [],
    "branched trunk 2048, ckpts 0.5/1.0, W 1024": [
        *BRANCHED, "branch.trunk_samples=2048", "branch.checkpoints=[0.5, 1.0]", "branch.window_samples=1024",
    ],
    "branched trunk 2048, ckpt 1.0, W 1024": [
        *BRANCHED, "branch.trunk_samples=2048", "branch.checkpoints=[1.0]", "branch.window_samples=1024",
    ],
    "branched trunk 2048, ckpt 1.0, W 512": [
        *BRANCHED, "branch.trunk_samples=2048", "branch.checkpoints=[1.0]", "branch.window_samples=512",
    ],
    "branched trunk 1024, ckpt 1.0, W 1024, 2 seeds": [
        *BRANCHED, "branch.trunk_samples=1024", "branch.checkpoints=[1.0]", "branch.window_samples=1024",
        "budget.seeds=[0, 1]",
    ],
}  # fmt: skip


def true_samples_to_target() -> dict[int, float]:
    eff = exhaustive_truth(NAME, TRUTH_SEEDS)
    return {
        c.batch_responses: c.estimate.samples_to_target if c.estimate else math.inf
        for c in eff.candidates
        if c.family == "main"
    }


def main() -> int:
    t0 = time.perf_counter()
    truth = true_samples_to_target()
    load = os.getloadavg()[0]
    probe = f"; probe seeds [{PROBE_SEEDS}]" if PROBE_SEEDS else ""
    print(
        f"# {NAME}; x86_64, {os.cpu_count()} cores, load {load:.1f} after the truth; "
        f"seeds {TRUTH_SEEDS}{probe}"
    )
    pairs = ", ".join(f"{b}: {r:,.0f}" for b, r in sorted(truth.items()))
    print(f"true R(B) (median over the truth seeds): {pairs}")
    thr: dict[str, tuple[int, float]] = {}
    print(
        "setting | recommended | critical batch [crossing CI] | probe samples | full run | cost [range]"
        " | regret | wall s"
    )
    settings = SETTINGS
    if PROBE_SEEDS:
        keep = list(SETTINGS)[:2]  # the grid and the branched defaults
        settings = {k: [*SETTINGS[k], f"budget.seeds=[{PROBE_SEEDS}]"] for k in keep}
    for name, sets in settings.items():
        with tempfile.TemporaryDirectory() as tmp:
            argv = ["batchtune", "tune", str(RECIPE), "--json", "--results", tmp]
            for s in sets:
                argv += ["--set", s]
            start = time.perf_counter()
            proc = subprocess.run(argv, capture_output=True, text=True)
            wall = time.perf_counter() - start
        if proc.returncode != 0:
            print(f"{name} | failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
            continue
        d = json.loads(proc.stdout)
        if not thr:
            thr = {c["name"]: (c["batch_responses"], c["responses_per_s"]) for c in d["candidates"]}
        t = {lab: truth.get(n, math.inf) / per_s for lab, (n, per_s) in thr.items()}
        best = min(v for v in t.values() if math.isfinite(v))
        rec = d["recommended"]["name"]
        crit = d.get("critical_training_batch") or {}
        ci = crit.get("crossing_ci") or [math.nan, math.nan]
        cost = d["probe_cost"]
        span = cost.get("ratio_range") or [math.nan, math.nan]
        print(
            f"{name} | {rec} | {crit.get('batch_responses', math.nan):g} "
            f"[{float(ci[0]):.0f}, {float(ci[1]):.0f}] | {cost['samples']:,} | "
            f"{cost['full_run_samples']:,.0f} | {cost['ratio']:.2f}x "
            f"[{float(span[0]):.2f}, {float(span[1]):.2f}] | {t[rec] / best:.3f} | {wall:.0f}"
        )
        sys.stdout.flush()
    print(f"# total wall {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
