"""Is the shipped tiny-grpo-async target hard enough for its R intervals to close? (issue 30)

The old target (eval_reward 0.9) was reached within ~160-300 samples from the warm start's 0.876, so
the seeds never parted and R's intervals stayed open above. This runs the shipped recipe's probe (its
target, grid, seeds and evaluation interval) in ONE process (algorithm.mode = "sync": the off-policy
candidates generate k batches ahead in turn, so their R is the same learning problem; only the step
times differ from the two-process runs), without sequential seeds or the top-up, to keep it to about
2 min of CPU; then reads the same runs at the shipped target and at the old 0.9: per candidate, R
and its interval (the efficiency code's, 2 seeds). A closed interval is finite at both ends.

    python benchmarks/async_target_check.py  (writes benchmarks/out/async_target_check.txt)
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "tiny-grpo-async.toml"
OUT = ROOT / "benchmarks" / "out" / "async_target_check.txt"
SETS = ["algorithm.mode=sync", "budget.max_extra_seeds=0", "budget.async_top_up_seeds=0"]


def _cli(*args: str) -> str:
    cmd = [sys.executable, "-m", "batchtune", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    if out.returncode not in (0, 2):  # 2: no critical batch, still ranked
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-2000:]}")
    return out.stdout


def _rows(results: Path, target: float | None) -> list[tuple[str, float, float, float]]:
    extra = [] if target is None else ["--set", f"target.value={target}"]
    data = json.loads(
        _cli("recommend", "-r", str(results), "--throughput", "probe", "--gpus", "1", "--json", *extra)
    )
    out = []
    for c in data["candidates"]:
        lo, hi = c.get("samples_ci") or (None, None)
        r = c.get("samples_to_target")
        out.append((c["name"], math.inf if r is None else float(r), _f(lo), _f(hi)))
    return out


def _f(x: object) -> float:
    return math.inf if x is None else float(x)  # type: ignore[arg-type]


def main() -> int:
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "r"
        sets = [a for s in SETS for a in ("--set", s)]
        _cli("probe", str(RECIPE), "--results", str(results), *sets)
        cpu = time.process_time()
        shipped = _rows(results, None)
        old = _rows(results, 0.9)
        manifest = json.loads((results / "manifest.json").read_text())["recipe"]
    target = manifest["target"]["value"]
    every = manifest["task"]["eval_every_samples"]
    lines = [
        f"tiny-grpo-async probe in one process (algorithm.mode = sync), seeds {manifest['budget']['seeds']}, "
        f"eval every {every} samples, runs stopped at the shipped target",
        f"R = samples-to-target [range of the seeds], and R in evaluations (R / {every}); shipped target "
        f"eval_reward {target} vs the old 0.9 read off the same runs",
        f"{'candidate':<12} {'R at ' + str(target):>10} {'interval':>14} {'evals':>6}  {'R at 0.9':>9} "
        f"{'interval':>14} {'evals':>6}",
    ]
    closed = 0
    evals: dict[str, list[float]] = {"new": [], "old": []}
    for (name, r, lo, hi), (_, r9, lo9, hi9) in zip(shipped, old, strict=True):
        closed += math.isfinite(lo) and math.isfinite(hi)
        evals["new"].append(r / every)
        evals["old"].append(r9 / every)
        lines.append(
            f"{name:<12} {r:10.0f} {f'[{lo:.0f}, {hi:.0f}]':>14} {r / every:6.1f}  {r9:9.0f} "
            f"{f'[{lo9:.0f}, {hi9:.0f}]':>14} {r9 / every:6.1f}"
        )
    n = len(shipped)
    med = {k: sorted(v)[len(v) // 2] for k, v in evals.items()}
    lines += [
        f"closed intervals (finite at both ends) at {target}: {closed} of {n}; median R "
        f"{med['new']:.1f} evaluations at {target}, {med['old']:.1f} at 0.9",
        f"wall {time.time() - t0:.0f} s (the probe in a child process; this process {cpu:.1f} s CPU)",
    ]
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
