"""What `batchtune tune` (the README's main job, recipes/tiny-grpo.toml) gives on this machine.

Runs the command exactly as a user does, in a fresh results directory, times it as a whole process,
and prints the figures README.md and docs/trainer.md quote (between include markers, so they cannot
drift): the critical training batch with its interval, each candidate's samples-to-target ratio and
verdict, the recommendation, the probe's cost against one full run, and the wall time.

    python benchmarks/default_tune.py [RECIPE] [--set budget.seeds=[3,4,5] ...] > benchmarks/out/NAME.txt
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path


def _num(x: object, spec: str) -> str:
    """A JSON number formatted; "inf" (how --json writes infinity) and None as they are."""
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default=None, help="recipe (default: the built-in tiny-grpo)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override")
    parser.add_argument("--plots", default="", help="copy the run's PNGs to docs/img/PLOTS-<name>.png")
    args = parser.parse_args()
    sets = [x for o in args.overrides for x in ("--set", o)]
    with tempfile.TemporaryDirectory() as tmp:
        recipe = [args.recipe] if args.recipe else []
        cmd = [sys.executable, "-m", "batchtune", "tune", *recipe, "-r", f"{tmp}/r", "--json", *sets]
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if args.plots and out.returncode == 0:
            img = Path(__file__).resolve().parents[1] / "docs" / "img"
            for png in sorted(Path(f"{tmp}/r/plots").glob("*.png")):
                name = png.stem.replace("_", "-").split("-2")[0]  # throughput-<profile id> -> throughput
                shutil.copy(png, img / f"{args.plots}-{name}.png")
    if out.returncode != 0:
        print(out.stderr[-2000:], file=sys.stderr)
        return out.returncode
    data = json.loads(out.stdout)
    crit = data["critical_training_batch"]
    versions = ", ".join(f"{p} {metadata.version(p)}" for p in ("torch", "transformers", "numpy", "scipy"))
    print(f"# batchtune tune {' '.join([*([args.recipe] if args.recipe else []), *sets])}".rstrip())
    print(
        f"# {platform.machine()}, {os.cpu_count()} cores, load {load0:.1f} at start; Python "
        f"{platform.python_version()}; {versions}"
    )
    print(f"wall time (whole process, probe + profile + recommend): {wall:.0f} s")
    lo, hi = crit["crossing_ci"] or (None, None)
    upper = "inf" if crit["upper"] is None else _num(crit["upper"], "g")
    print(
        f"critical training batch: {_num(crit['batch_responses'], 'g')} responses "
        f"(measured bracket {_num(crit['lower'], 'g')}-{upper}); "
        f"1+tol crossing {_num(crit['crossing'], '.0f')} ({crit.get('crossing_kind') or 'interval'} "
        f"[{_num(lo, '.0f')}, {_num(hi, '.0f')}])"
    )
    if crit["fit"]:
        print(f"fit: {crit['fit']['summary']}")
    print(f"{'candidate':<12}{'N':>6}{'seeds':>7}{'R/R0':>8}  {'90% CI':<16}{'verdict':<12}")
    for c in data["candidates"]:
        ci = c["sample_ratio_ci"]
        ci_text = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci and None not in ci else "-"
        ratio = c["sample_ratio"]
        print(
            f"{c['name']:<12}{c['batch_responses']:>6}{c['n_seeds']:>7}"
            f"{(f'{ratio:.2f}' if isinstance(ratio, float) else '-'):>8}  {ci_text:<16}{c['status']:<12}"
        )
    rec = data["recommended"]
    print(f"recommended: {rec['name']} ({rec['batch_responses']} responses, lr {rec['lr']:.3g})")
    print(f"  why: {rec['reason']}")
    high, against = rec.get("regret_high"), rec.get("regret_against")
    if high is None:
        print("  how sure: no interval (the pick rests on one seed)")
    elif against is None:
        print("  how sure: no other measured batch is faster at the far end of its 90% interval")
    else:
        print(f"  how sure: {against} could be up to {float(high):.2f}x faster (far end of its 90% interval)")
    for why in rec.get("evidence", []):
        print(f"  weak evidence: {why}")
    cost = data.get("probe_cost") or {}
    if cost:
        print(
            f"probe cost: {cost.get('samples', 0):,} samples = {cost.get('ratio', float('nan')):.1f}x "
            f"one full run at the recommendation ({cost.get('full_run_samples', 0):,.0f} samples)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
