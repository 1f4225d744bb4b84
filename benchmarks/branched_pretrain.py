"""The branched probe of a pre-training recipe against its grid: picks, regret, cost, local B_crit.

    python benchmarks/branched_pretrain.py > benchmarks/out/branched_pretrain.txt

Truth: recipes/tiny-pretrain.toml's grid (every token batch from scratch until the eval loss is
confirmed below 1.8, 48,000 tokens at most) at seeds 10, 11, 12 (disjoint from the probes'),
cached under benchmarks/cache/tiny-pretrain-grid-truth; true R(B) = the median over those seeds of
the tokens to each target loss (a seed that never reaches it counts as +inf).
Time: T(B) = true R(B) / Θ(B), with Θ(B) = B / the median step seconds the truth runs measured at
B (one Θ for every row, so regret here is the error from the samples axis alone); regret =
T(pick) / min over B of T(B).
Each row: the probe of recipes/tiny-pretrain-branched.toml (as shipped, or with one setting
changed) at the probe seeds given, in a fresh results directory, then `recommend` from its own
step times: the pick, its regret, the probe's tokens against one true full run at the pick, the
critical batch it reports, the pick's tokens-to-target as the probe estimates it (R(B0) extrapolated
from the trunk, times the measured ratio) with its interval against the truth, and the local
critical batch at each checkpoint with its interval.
The grid's local ratio R(B)/R(16) at the checkpoint's level is printed beside it for context: it
is not the same quantity (a branch starts from the trunk's state; the grid starts every batch from
scratch), so it is no truth for the local value, only for the final pick.
CPU wall seconds on this machine, one run at a time.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from batchtune.measure.pretrain_probe import load_grid_curves, run_pretrain_probe
from batchtune.recipe.load import load_recipe
from batchtune.records.store import ResultsStore
from batchtune.workflow import probe as run_probe
from batchtune.workflow.recommend import recommend_for_recipe

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks" / "cache"
TRUTH_SEEDS = [10, 11, 12]
LEVELS = [2.4, 2.2, 2.0, 1.9, 1.8]
RECIPE = ROOT / "recipes" / "tiny-pretrain-branched.toml"
PROBE_SEEDS = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
SETTINGS: dict[str, list[str]] = {
    "as shipped (branch.search = all, 3 checkpoints, W 4096)": [],
    "trunk 32,768 (closer to the target)": ["branch.trunk_samples=32768"],
    "branch.search = bisect": ["branch.search=bisect"],
    "branch.search = bisect, window 2048": ["branch.search=bisect", "branch.window_samples=2048"],
}


def first_crossing(tokens: tuple[float, ...], loss: tuple[float, ...], level: float) -> float:
    """Tokens at the first eval loss at or below ``level``, EMA-smoothed (alpha 0.5, the recipes'
    target.ema_alpha) so that one lucky evaluation does not count; inf if never."""
    ema = None
    for t, v in zip(tokens, loss, strict=True):
        ema = v if ema is None else 0.5 * v + 0.5 * ema
        if ema <= level:
            return float(t)
    return math.inf


def grid_truth() -> tuple[dict[float, dict[int, float]], dict[int, float], int]:
    """{level: {batch: median tokens to it}}, {batch: tokens/s}, and the tokens the grid spent,
    from the truth grid (cached)."""
    where = CACHE / "tiny-pretrain-grid-truth"
    cfg = load_recipe(
        ROOT / "recipes" / "tiny-pretrain.toml",
        [f"budget.seeds={TRUTH_SEEDS}", f"run.results_dir={where}", f"pretrain.targets={LEVELS}"],
    )
    run_pretrain_probe(cfg)
    store = ResultsStore(where)
    curves, _ = load_grid_curves(store)
    r: dict[float, dict[int, float]] = {}
    for level in LEVELS:
        by_batch: dict[int, list[float]] = {}
        for c in curves:
            by_batch.setdefault(int(c.batch_tokens), []).append(first_crossing(c.tokens, c.loss, level))
        r[level] = {b: float(np.median(v)) for b, v in sorted(by_batch.items())}
    step_s: dict[int, list[float]] = {}
    for rec in store.runs():
        step_s.setdefault(rec.batch_responses, []).extend(s.train_s for s in store.steps(rec.run_id))
    thr = {b: b / float(np.median(v)) for b, v in sorted(step_s.items())}
    return r, thr, sum(rec.samples for rec in store.runs())


def level_ratio(truth: dict[float, dict[int, float]], level: float, batch: int) -> float:
    """The grid's R(B)/R(16) at the truth level nearest ``level`` (context, not truth)."""
    near = min(truth, key=lambda lv: abs(lv - level))
    row = truth[near]
    return row[batch] / row[min(row)]


def one_probe(overrides: list[str], seeds: list[int], results: Path) -> tuple[object, object, float]:
    cfg = load_recipe(RECIPE, [*overrides, f"budget.seeds={seeds}", f"run.results_dir={results}"])
    t0 = time.perf_counter()
    result = run_probe(cfg)
    wall = time.perf_counter() - t0
    rec, _, _ = recommend_for_recipe(cfg, "probe", None, 1, plot=False)
    return result, rec, wall


def main() -> int:
    t0 = time.perf_counter()
    truth, thr, grid_tokens = grid_truth()
    final = truth[min(LEVELS)]
    times = {b: final[b] / thr[b] for b in final}
    best = min(times, key=lambda b: times[b])
    load = os.getloadavg()[0]
    print(f"# tiny-pretrain grid truth, seeds {TRUTH_SEEDS}; x86_64, {os.cpu_count()} cores, load {load:.1f}")
    print("# true tokens to each target loss (median of 3 seeds); T(B) at 1.8 from the truth's step times")
    print("batch   " + "".join(f"  L={lv:<7g}" for lv in LEVELS) + "   tok/s    T(1.8) s   T/T_best")
    for b in sorted(final):
        row = "".join(f"  {truth[lv][b]:9,.0f}" for lv in LEVELS)
        print(f"{b:5d}  {row}  {thr[b]:7,.0f}  {times[b]:9.2f}  {times[b] / times[best]:8.2f}")
    print(f"# best at 1.8 by time: B{best}; by tokens: B{min(final, key=lambda b: final[b])}")
    print(
        f"# the grid itself (27 runs, every batch to 1.8): {grid_tokens:,} tokens = "
        f"{grid_tokens / final[best]:.1f}x one full run at B{best}"
    )
    print()
    for name, overrides in SETTINGS.items():
        print(f"## {name}")
        regrets, costs, hits = [], [], []
        for seeds in PROBE_SEEDS:
            tmp = Path(tempfile.mkdtemp(prefix="bt-branched-pretrain-"))
            try:
                result, rec, wall = one_probe(overrides, seeds, tmp / "r")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            pick = rec.winner.batch_responses  # type: ignore[attr-defined]
            regret = times[pick] / times[best]
            eff = result.efficiency  # type: ignore[attr-defined]
            cost = eff.total_samples / final[pick]
            crit = eff.critical.batch if eff.critical is not None else None
            est = eff.get(rec.winner.label).estimate  # type: ignore[attr-defined]
            lo, hi = eff.absolute_ci(est)
            covered = lo <= final[pick] <= hi
            regrets.append(regret)
            costs.append(cost)
            hits.append(covered)
            print(
                f"seeds {seeds}: pick B{pick}, regret {regret:.2f}; critical batch {crit}; probe "
                f"{eff.total_samples:,} tokens = {cost:.2f}x one true full run at the pick "
                f"({final[pick]:,.0f}); wall {wall:.0f} s"
            )
            print(
                f"    R(pick) estimated {est.samples_to_target:,.0f} [{lo:,.0f}, {hi:,.0f}] against the true "
                f"{final[pick]:,.0f}: {est.samples_to_target / final[pick]:.2f}x, interval "
                f"{'covers' if covered else 'misses'} it"
            )
            for lc in result.summary.locals:  # type: ignore[attr-defined]
                lo, hi = lc.interval
                ctx = ", ".join(
                    f"{b}: {level_ratio(truth, lc.level, b):.2f}" for b in (32, 64, 128, 256, 512)
                )
                print(
                    f"    checkpoint {lc.checkpoint_samples:>6,.0f}: loss {lc.start_value:.3f} -> "
                    f"{lc.level:.3f}, local B_crit {lc.point:,.0f} [{lo:,.0f}, {hi:,.0f}]; grid R(B)/R(16) "
                    f"near that loss: {ctx}"
                )
        print(
            f"# {name}: regret <= 1.05 on {sum(r <= 1.05 for r in regrets)} of {len(regrets)}, median "
            f"{np.median(regrets):.2f}, max {max(regrets):.2f}; cost median {np.median(costs):.2f}x "
            f"({min(costs):.2f}-{max(costs):.2f}x); R(pick)'s interval covers the truth on {sum(hits)} of "
            f"{len(hits)}"
        )
        print()
    print(f"# total wall {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
