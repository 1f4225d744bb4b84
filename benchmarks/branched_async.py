"""Branched against grid on an off-policy (staleness) sweep of the NQM: cost and regret (issue 30).

Should `probe.mode = "auto"` (measure/probe_size.py) choose a branched probe for a recipe that sweeps
staleness k? This measures both probes on the same recipe and seed sets:

- recipe: recipes/nqm.toml at N = 8 ... 512 (prompts 1 ... 64, G 8), probe.staleness = [0, 1, 2]
  (u = 1), the recipe's own [branch] settings for the branched probe; each seed set in a fresh
  results directory, `probe` then `recommend --throughput probe` (the simulated time model);
  three instances: A the recipe's time model (generation-bound: async gains ~7%), B training as
  long as generation (async up to 2x), C as B at noise scale 3 (the best async batch is P16, P32
  within 10%);
- grid: every (B, k) at the planned seeds, the async seed top-up after them (measure/async_topup.py);
- branched: the on-policy trunk and branches, and each k >= 1 branched at the last checkpoint read,
  at the batch the search adopted there (measure/branched_async.py), R(B, k) = R(B) x the ratio;
  "br-8192" the same with a trunk of 8,192 samples (the last checkpoint at 2/3 of R, not 1/6);
  "br-target" the shipped trunk with branch.offpolicy_read = "target": each k >= 1 branch, and a k = 0
  branch beside it, run from the checkpoint to the target (capped at 2x the k = 0 run), read there;
- truth: R_true(B, k) from the exact expected loss of the NQM with gradients delayed by k updates
  (backends/nqm_async.expected_async_samples_to_target: the backend's own dynamics), T_true =
  R_true / Theta, Theta the recommendation's own responses/s for that (B, k) row (the same pipeline
  model for both probes); best = the least T_true over every (B, k) the grid ranks;
- regret = T_true(pick) / T_true(best); cost = samples the probe spent (probe_cost.samples).

    python benchmarks/branched_async.py   (writes benchmarks/out/branched_async.txt)
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from pathlib import Path

from batchtune.backends.nqm_async import expected_async_samples_to_target
from batchtune.recipe.load import load_recipe
from batchtune.workflow.recommend import recommend_for_recipe
from batchtune.workflow.study import study_for

OUT = Path(__file__).resolve().parent / "out" / "branched_async.txt"
RECIPE = "recipes/nqm.toml"
SETS = ["candidates.prompts=[1, 2, 4, 8, 16, 32, 64]", "probe.staleness=[0, 1, 2]"]
SEED_SETS = ([0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11])
GRID_SETS = 2  # the grid at the first two seed sets only (~25 s of CPU each); branched at all four
MODES = {  # branched at the recipe's trunk (2,048 samples), at one near the target (R ~12k), read to it
    "grid": ["probe.mode=grid"],
    "branched": ["probe.mode=branched"],
    "br-8192": ["probe.mode=branched", "branch.trunk_samples=8192"],
    "br-target": ["probe.mode=branched", "branch.offpolicy_read=target"],
}
BALANCED = ["nqm.train_t0_s=0.64", "nqm.train_t1_s=0.016"]  # training as long as generation
INSTANCES = {  # name -> recipe settings
    "A gen-bound (the recipe's time model)": [],
    "B train = gen": BALANCED,
    "C train = gen, noise 3": [*BALANCED, "nqm.noise_scale=3"],
}


def _probe(
    extra: list[str], mode: str, seeds: list[int], root: Path
) -> tuple[str, dict[str, float], float, float]:
    """(pick label, label -> responses/s of its row, samples spent, CPU seconds)."""
    sets = [*SETS, *extra, *MODES[mode], f"budget.seeds={seeds}", f"run.results_dir={root}"]
    cfg = load_recipe(RECIPE, sets)
    t0 = time.process_time()
    res = study_for(cfg).probe(cfg, None)
    rec, _, _ = recommend_for_recipe(cfg, "probe", None, 1, plot=False)
    d = rec.async_decision
    assert d is not None, "no async ranking"
    theta = {r.label: r.choice.responses_per_s for r in d.rows}
    best = min(d.rows, key=lambda r: r.choice.t)
    return best.label, theta, float(res.efficiency.total_samples), time.process_time() - t0


def _truth(cfg_sets: list[str]) -> dict[str, float]:
    """label -> R_true at every (B, k) of the plan (inf where the expected loss never reaches it)."""
    from batchtune.measure.plan import plan_candidates

    cfg = load_recipe(RECIPE, [*cfg_sets, "probe.mode=grid"])
    out = {}
    for c in plan_candidates(cfg).candidates:
        out[c.label] = expected_async_samples_to_target(
            cfg.nqm, lr=c.lr, batch=c.batch_responses, delay=c.staleness,
            updates_per_batch=max(1, c.updates_per_batch // max(1, cfg.algorithm.mini_batches)),
            target_loss=cfg.target.value,
        )  # fmt: skip
    return out


Summary = dict[str, list[tuple[float, float]]]  # probe -> (regret, samples) per probe made


def _instance(name: str, extra: list[str], tmp: Path, summary: Summary) -> list[str]:
    r_true = _truth([*SETS, *extra])
    lines = [
        f"instance {name}: {' '.join(extra) or 'as shipped'}",
        "  R_true (samples to loss 1.0): " + ", ".join(f"{lab} {r:,.0f}" for lab, r in r_true.items()),
        f"  {'seeds':>12} {'probe':>9} {'pick':>14} {'regret':>7} {'samples':>10} {'cpu s':>6}",
    ]
    theta: dict[str, float] = {}  # the simulated time model: the same responses/s at every seed
    t_true: dict[str, float] = {}
    for i, seeds in enumerate(SEED_SETS):
        modes = list(MODES) if i < GRID_SETS else [m for m in MODES if m != "grid"]
        for m in modes:
            pick, th, samples, cpu = _probe(extra, m, seeds, tmp / f"{name[0]}-{m}-{seeds[0]}")
            if m == "grid" and not theta:
                theta = th
                t_true = {lab: r_true[lab] / v for lab, v in theta.items() if v > 0}
            regret = r_true[pick] / th[pick] / min(t_true.values())
            summary[m].append((regret, samples))
            lines.append(f"  {str(seeds):>12} {m:>9} {pick:>14} {regret:7.3f} {samples:10,.0f} {cpu:6.1f}")
    best = min(t_true, key=lambda lab: t_true[lab])
    near = sorted(t_true, key=lambda lab: t_true[lab])[:4]
    lines.append(
        f"  best {best} (T_true {t_true[best]:.1f} s); the 4 least T_true: "
        + ", ".join(f"{lab} {t_true[lab] / t_true[best]:.3f}x" for lab in near)
    )
    inf = [lab for lab, r in r_true.items() if not math.isfinite(r)]
    if inf:
        lines.append(f"  never reach the target in expectation: {', '.join(inf)}")
    return [*lines, ""]


def main() -> int:
    t_start = time.process_time()
    lines = [
        "branched vs grid on an off-policy sweep of the NQM "
        "(recipes/nqm.toml, N 8..512, k in {0, 1, 2}, u 1)",
        f"machine: {os.uname().machine} {os.cpu_count()} cores, shared; load at start "
        + open("/proc/loadavg").read().split()[0],
        "truth: exact expected loss with gradients delayed by k (nqm_async); "
        "T_true = R_true / Theta of the row;",
        f"regret = T_true(pick) / least T_true; grid at the first {GRID_SETS} seed sets, branched at all "
        f"{len(SEED_SETS)}",
        "",
    ]
    summary: Summary = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in INSTANCES.items():
            lines += _instance(name, extra, Path(tmp), summary)
    for m, rows in summary.items():
        regs = [r for r, _ in rows]
        cost = sum(s for _, s in rows) / len(rows)
        lines.append(
            f"{m}: max regret {max(regs):.3f}, mean {sum(regs) / len(regs):.3f} over {len(rows)} probes; "
            f"mean samples {cost:,.0f}"
        )
    g = sum(s for _, s in summary["grid"]) / len(summary["grid"])
    for m in MODES:
        if m != "grid":
            b = sum(s for _, s in summary[m]) / len(summary[m])
            lines.append(f"{m} mean cost / grid mean cost: {b / g:.3f}")
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text, end="")
    print(f"cpu {time.process_time() - t_start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
