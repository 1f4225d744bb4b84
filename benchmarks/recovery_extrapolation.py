"""Recovery study of the trunk's extrapolation to the target
(analysis/branched/progress.extrapolate_to_target).

    python benchmarks/recovery_extrapolation.py > benchmarks/out/recovery_extrapolation.txt

A branched probe whose trunk stops before the target extrapolates R(B0) from it; that point and
its interval set every absolute number the probe prints (R, time, the full run it names and the
probe's cost over it). Here real curves that DID reach the target are cut at a trunk length T and
extrapolated; truth = the same curve's own crossing (the isotonic estimator on the whole curve).
Sources:
  nqm        recipes/nqm.toml at the reference batch (N = 8), 20 seeds (`batchtune probe`, a fresh
             results dir), loss to 1.0;
  tiny-grpo, tiny-ppo  the exhaustive runs of benchmarks/regret_tiny.py (every candidate at seeds
             10-12, held-out reward to 0.9; cached under benchmarks/cache/, built on first use).
Per source and T (curves that reach the target before T / 0.9 are left out): the point's ratio to
the truth (median and 10-90% range over curves, nearest observations; inf = the fit's trend never
reaches the target), and how often the interval covers the truth, for the shipped interval and for
the slope's t interval of the point's own fit alone (the interval before).
"""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))

from regret_tiny import CACHE, exhaustive_truth  # noqa: E402

from batchtune.analysis.branched.progress import extrapolate_to_target  # noqa: E402
from batchtune.analysis.sample.curves import samples_to_target  # noqa: E402
from batchtune.analysis.sample.efficiency import RunData  # noqa: E402
from batchtune.records.store import ResultsStore  # noqa: E402

# the tiny runs log every 256 samples: a trunk of 1024 has 3 points in its last half, too few to fit
TRUNKS = {"nqm": [1024, 2048, 3072, 4096], "tiny-grpo": [2048, 3072, 4096], "tiny-ppo": [2048, 3072, 4096]}


def t_interval(s: np.ndarray, v: np.ndarray, target: float, hib: bool) -> tuple[float, float]:
    """The interval before: metric linear in log(samples) over the last half, slope's 90% t bounds."""
    keep = s >= s[-1] / 2
    xs, ys = np.log(s[keep]), v[keep]
    res = stats.linregress(xs, ys)
    q = float(stats.t.ppf(0.95, xs.size - 2))
    sign = 1.0 if hib else -1.0
    end = res.intercept + res.slope * xs[-1]

    def reach(slope: float) -> float:
        x = xs[-1] + (target - end) / slope if sign * slope > 0 else math.inf
        return math.exp(x) if x < 700 else math.inf

    a, b = reach(res.slope + sign * q * res.stderr), reach(res.slope - sign * q * res.stderr)
    return min(a, b), max(a, b)


def curves(name: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], float, bool, str]:
    if name == "nqm":
        tmp = tempfile.mkdtemp()
        seeds = list(range(20))
        argv = ["batchtune", "probe", "recipes/nqm.toml", "--results", tmp, "--json"]
        argv += ["--set", "candidates.prompts=[1]", "--set", f"budget.seeds={seeds}"]
        subprocess.run(argv, check=True, capture_output=True)
        store, metric, target, hib = ResultsStore(tmp), "loss", 1.0, False
    else:
        exhaustive_truth(name, [10, 11, 12])
        store, metric, target, hib = ResultsStore(CACHE / f"{name}-exhaustive"), "eval_reward", 0.9, True
    out = []
    for r in store.runs():
        s, v = RunData(r, tuple(store.steps(r.run_id))).curve(metric)
        out.append((s.astype(float), v.astype(float)))
    return out, target, hib, metric


def main() -> None:
    t0 = time.perf_counter()
    print(
        "source | trunk T | curves | point / truth: median [10%, 90%] | covered: shipped | t interval before "
        "| shipped interval / truth: median low, high"
    )
    for name, trunks in TRUNKS.items():
        data, target, hib, metric = curves(name)
        for T in trunks:
            ratios, cover, cover_t, lows, highs = [], [], [], [], []
            for s, v in data:
                hit = samples_to_target(s, v, target, higher_is_better=hib)
                if hit.censored or hit.samples_to_target is None or hit.samples_to_target <= T / 0.9:
                    continue
                truth = hit.samples_to_target
                m = (s > 0) & (s <= T)
                p, lo, hi = extrapolate_to_target(s[m], v[m], target, higher_is_better=hib)
                tlo, thi = t_interval(s[m], v[m], target, hib)
                ratios.append(p / truth)
                cover.append(lo <= truth <= hi)
                cover_t.append(tlo <= truth <= thi)
                lows.append(lo / truth)
                highs.append(hi / truth)
            r = np.array(ratios)
            q10, q50, q90 = np.quantile(r, [0.1, 0.5, 0.9], method="nearest")  # inf-safe: no interpolation
            print(
                f"{name} ({metric} to {target}) | {T:,} | {r.size} | {q50:.2f} [{q10:.2f}, {q90:.3g}] | "
                f"{np.mean(cover):.2f} | {np.mean(cover_t):.2f} | "
                f"{np.median(lows):.2f}, {np.quantile(highs, 0.5, method='nearest'):.3g}",
                flush=True,
            )
    print(f"# total wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
