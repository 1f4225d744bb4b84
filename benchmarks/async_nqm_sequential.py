"""Async NQM regret at the default 3 seeds, with more seeds only where the decision hinges (issue 30).

benchmarks/async_nqm_regret.py's 3-seed probe misses the goal (max regret 1.741). Why: on the
noisy instances it picks (B=32, k=2, u=2), a delayed gradient near its stability edge. Its 3 seeds
agree (T 74.0 / 76.6 / 76.3 on noise 2, p 1.5, 5:1) and all sit well below the truth (128.8): the
expected loss of a near-unstable run is carried by rare large excursions, which 3 seeds rarely show
and 8 seeds do (8-seed estimate 141.2). Seed disagreement cannot flag it; being close to the best can.

The rule (sequential seeds where the decision hinges): probe every candidate at 3 seeds; every
candidate whose estimated T is within a factor (1 + margin) of the best estimate gets topped up to
TOP seeds; repeat with the new estimates until no contender lacks seeds; pick the argmin. The loop is
the probe's own (analysis/decide/async_topup.top_up, run by measure/async_topup.py after an async
probe's planned seeds), fed these estimates. Duplicates (candidates whose pipeline reaches the same
lag d, so they run the same dynamics) share runs.

Part 2 runs the 8 reported instances through the real probe (measure/probe.run_probe on the NQM
backend with the instance's time model, its store, the top-up rounds of measure/async_topup.py and
their record, then `recommend`), at the shipped margin: see ``real_probe_lines``.

The margin is CHOSEN ON HELD-OUT INSTANCES (other noise, curvature power and gen:train ratios than
the 8 reported), two seed draws each: the smallest margin whose held-out max regret is <= 1.05, or
else the one with the least held-out max regret. The 8 reported instances are then scored once at
that margin (out of sample for the margin; the probe's smoothing width nqm_async.SMOOTH was chosen
earlier on those 8 instances, so the estimator itself is not fully out of sample: said beside).
Cost: seed-runs of distinct (B, d, u) over those of the plain 3-seed probe.

    python benchmarks/async_nqm_sequential.py  (writes benchmarks/out/async_nqm_sequential.txt)
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from async_nqm_regret import BATCHES, INSTANCES, KS, US, Instance, lr_of, pipeline_of  # noqa: E402

from batchtune.analysis.decide.async_topup import (  # noqa: E402
    FIXED_MARGIN,
    MARGIN,
    MAX_SEEDS,
    TOP_SEEDS,
    top_up,
)
from batchtune.backends.nqm_async import (  # noqa: E402
    expected_async_samples_to_target,
    expected_async_step_samples_to_target,
    simulate_samples_to_target,
)
from batchtune.recipe.schema import NQMConfig  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "async_nqm_sequential.txt"
BASE, TOP = 3, TOP_SEEDS
MARGINS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, math.inf)  # inf: TOP seeds everywhere
DRAWS = (0, 100)  # first seed of each draw: seeds DRAW .. DRAW + TOP - 1
HELD_OUT = [
    Instance(noise, power, g, t)
    for noise in (1.0, 4.0)
    for power in (1.25, 2.0)
    for g, t in ((0.03, 0.01), (0.01, 0.02))
]
Cand = tuple[int, int, int]


def _cfg(inst: Instance) -> tuple[NQMConfig, float]:
    cfg = NQMConfig(dim=64, noise_scale=inst.noise, curvature_power=inst.power)
    return cfg, 0.15 * 0.5 * sum((1.0 / i**inst.power) for i in range(1, 65))


@cache
def _grid(inst: Instance) -> dict[Cand, tuple[float, int]]:
    """(responses/s, lag d) per candidate, from the pipeline model."""
    return {c: pipeline_of(inst, *c) for c in itertools.product(BATCHES, KS, US)}


@cache
def _truth(inst: Instance) -> dict[Cand, float]:
    cfg, target = _cfg(inst)
    out = {}
    for (b, k, u), (theta, d) in _grid(inst).items():
        r = expected_async_samples_to_target(
            cfg, lr=lr_of(b), batch=b, delay=d, updates_per_batch=u, target_loss=target
        )
        out[(b, k, u)] = r / theta
    return out


@cache
def _probe_r(inst: Instance, b: int, d: int, u: int, first: int, n: int) -> float:
    cfg, target = _cfg(inst)
    r, _ = simulate_samples_to_target(
        cfg, lr=lr_of(b), batch=b, delay=d, updates_per_batch=u, target_loss=target,
        seeds=list(range(first, first + n)), max_updates=4000,
    )  # fmt: skip
    return r


def sequential_pick(inst: Instance, margin: float, first: int) -> tuple[Cand, int]:
    """(pick, seed-runs spent on distinct (B, d, u)): the probe's own top-up loop
    (analysis/decide/async_topup.top_up, which measure/async_topup.py runs) over these estimates;
    margin < 0: no top-up (the plain 3-seed probe)."""
    grid = _grid(inst)
    seeds = dict.fromkeys(grid, BASE)
    names = {str(c): c for c in grid}

    def est(c: Cand) -> float:
        theta, d = grid[c]
        return _probe_r(inst, c[0], d, c[2], first, seeds[c]) / theta

    def estimate() -> tuple[dict[str, float], dict[str, int]]:
        return {n: est(c) for n, c in names.items()}, {n: seeds[c] for n, c in names.items()}

    def run(labels: list[str], n: int) -> None:
        seeds.update({names[lab]: n for lab in labels})

    if margin >= 0:
        top_up(estimate, run, margin=margin, top=TOP)
    t = {c: est(c) for c in grid}
    spent: dict[tuple[int, int, int], int] = {}
    for c, n in seeds.items():
        key = (c[0], grid[c][1], c[2])
        spent[key] = max(spent.get(key, 0), n)
    pick = min(grid, key=lambda c: (t[c], c[1], c[2]))
    return pick, sum(spent.values())


def base_cost(inst: Instance) -> int:
    return BASE * len({(c[0], d, c[2]) for c, (_, d) in _grid(inst).items()})


def score(instances: list[Instance], margin: float, first: int) -> tuple[list[float], float]:
    """(regret per instance, total cost over the 3-seed probe's)."""
    regrets, spent, base = [], 0, 0
    for inst in instances:
        truth = _truth(inst)
        pick, cost = sequential_pick(inst, margin, first)
        regrets.append(truth[pick] / min(truth.values()))
        spent, base = spent + cost, base + base_cost(inst)
    return regrets, spent / base


def main() -> int:
    t0 = time.process_time()
    lines = [
        "async NQM regret at 3 seeds with sequential seeds where the decision hinges "
        f"(contenders within (1 + margin) x the best estimated T topped up to {TOP} seeds, repeated)",
        "instances: the 8 of async_nqm_regret.py (reported) and 8 held-out ones "
        "(noise 1/4 x p 1.25/2 x gen:train 3:1/1:2, same grid, dim, target and LR rule);",
        f"two seed draws each (seeds {DRAWS[0]}.. and {DRAWS[1]}..); cost = seed-runs of distinct (B, d, u) "
        "over the plain 3-seed probe's",
        "",
        "held-out instances (the margin is chosen here):",
        f"{'margin':>7} {'max regret':>11} {'mean':>6} {'cost':>6}",
    ]
    held: dict[float, tuple[float, float, float]] = {}
    for m in MARGINS:
        regs, costs = [], []
        for first in DRAWS:
            r, c = score(HELD_OUT, m, first)
            regs += r
            costs.append(c)
        held[m] = (max(regs), sum(regs) / len(regs), sum(costs) / len(costs))
        lines.append(f"{m:7.2f} {held[m][0]:11.3f} {held[m][1]:6.3f} {held[m][2]:6.2f}x")
    lines.append(f"(margin inf = {TOP} seeds for every candidate)")
    ok = [m for m in MARGINS if held[m][0] <= 1.05]
    chosen = min(ok) if ok else min(MARGINS, key=lambda m: (held[m][0], m))
    why = "smallest with held-out max regret <= 1.05" if ok else "least held-out max regret, then smallest"
    shipped = (
        f"the fixed rule's margin async_topup.FIXED_MARGIN; the default margin {MARGIN} goes with the "
        "sequential rounds, async_nqm_seqtest.py"
        if chosen == FIXED_MARGIN
        else f"NOT the fixed rule's margin {FIXED_MARGIN}"
    )
    lines += ["", f"chosen margin {chosen} ({why}; {shipped})", ""]
    lines.append("reported instances at the chosen margin (out of sample for the margin):")
    lines.append(f"{'noise':>5} {'p':>4} {'gen:train':>9}  {'best':>13}  {'pick draw 0':>13} {'regret':>7}  "
                 f"{'pick draw 1':>13} {'regret':>7}  {'3 seeds plain':>13}")  # fmt: skip
    all_regs, costs = [], []
    for inst in INSTANCES:
        truth = _truth(inst)
        best = min(truth, key=lambda c: truth[c])
        ratio = inst.gen_per_resp_s / inst.train_per_resp_s
        row = f"{inst.noise:5.1f} {inst.power:4.1f} {ratio:8.0f}:1  {str(best):>13}"
        for first in DRAWS:
            pick, _ = sequential_pick(inst, chosen, first)
            reg = truth[pick] / truth[best]
            all_regs.append(reg)
            row += f"  {str(pick):>13} {reg:7.3f}"
        plain, _ = sequential_pick(inst, -1.0, DRAWS[0])  # margin < 0: nobody topped up
        row += f"  {truth[plain] / truth[best]:13.3f}"
        lines.append(row)
    for first in DRAWS:
        costs.append(score(INSTANCES, chosen, first)[1])
    plain_regs = [score(INSTANCES, -1.0, first)[0] for first in DRAWS]
    lines += [
        "",
        f"reported, chosen margin {chosen}: max regret {max(all_regs):.3f}, "
        f"mean {sum(all_regs) / len(all_regs):.3f} over 8 instances x 2 draws (goal <= 1.05); "
        f"cost {sum(costs) / len(costs):.2f}x the 3-seed probe ({TOP} seeds everywhere: {TOP / BASE:.2f}x)",
        f"plain 3 seeds: max regret {max(plain_regs[0]):.3f} (draw 0), {max(plain_regs[1]):.3f} (draw 1)",
        "held-out: " + ", ".join(f"margin {m}: {held[m][0]:.3f}" for m in MARGINS) + " (max regret)",
        "the estimator's smoothing (nqm_async.SMOOTH) was chosen earlier on the 8 reported instances "
        "(8 seeds); the margin was not: it comes from the held-out instances only",
    ]
    lines += real_probe_lines()
    text = "\n".join(lines) + "\n"
    OUT.write_text(text)
    print(text, end="")
    print(f"cpu {time.process_time() - t0:.1f} s", file=sys.stderr)
    return 0


# ---- part 2: the same rule through the real probe (measure/probe.run_probe on the NQM backend) ----
# The NQM backend runs staleness k as a gradient delayed by exactly k updates and u updates per batch
# (backends/nqm.py, nqm_async.py's dynamics); its simulated time model is set to the instance's:
# generation 2 + g B s per batch (max_new_tokens 1), training 0.5 + t B s per update. The probe
# stores every run, tops up under budget.async_top_up_* (measure/async_topup.py, its record kept in
# async_topup.json) and `recommend --throughput probe` ranks (B, k, u) with its own pipeline model.
# Truth: R_true at delay k (what the backend ran), T_true = R_true / the row's responses/s.
PROBE_INSTANCES = INSTANCES  # the 8 reported ones, seeds 0.. (draw 0)
PROBE_KS, PROBE_US, PROBE_PROMPTS = KS, US, tuple(b // 8 for b in BATCHES)  # the same grid


def _probe_sets(inst: Instance, root: Path, top: int, first: int = 0) -> list[str]:
    _, target = _cfg(inst)
    return [
        "probe.mode=grid", f"run.results_dir={root}", "nqm.dim=64", f"nqm.noise_scale={inst.noise}",
        f"nqm.curvature_power={inst.power}", "generation.max_new_tokens=1", "nqm.gen_t0_s=2.0",
        f"nqm.gen_t1_s={inst.gen_per_resp_s}", "nqm.train_t0_s=0.5",
        f"nqm.train_t1_s={inst.train_per_resp_s}",
        "optimizer.lr=0.3", "lr_scaling.rule=sqrt", f"candidates.prompts={list(PROBE_PROMPTS)}",
        f"target.value={target}", f"probe.staleness={list(PROBE_KS)}",
        f"probe.updates_per_batch={list(PROBE_US)}", f"budget.seeds={list(range(first, first + BASE))}",
        f"budget.async_top_up_seeds={top}", "budget.max_samples=8192",
    ]  # fmt: skip


def _real_probe(
    inst: Instance, root: Path, top: int, first: int = 0
) -> tuple[str, dict[str, float], int, int]:
    """(pick, label -> responses/s, seed-runs in the store, topped-up candidates) of one probe whose
    planned seeds start at ``first`` (the top-up's follow them)."""
    from batchtune.measure.probe import run_probe
    from batchtune.measure.topup_record import load_top_up
    from batchtune.recipe.load import load_recipe
    from batchtune.records.store import ResultsStore
    from batchtune.workflow.recommend import recommend_for_recipe

    cfg = load_recipe("recipes/nqm.toml", _probe_sets(inst, root, top, first))
    run_probe(cfg)
    rec, _, _ = recommend_for_recipe(cfg, "probe", None, 1, plot=False)
    d = rec.async_decision
    assert d is not None
    theta = {r.label: r.choice.responses_per_s for r in d.rows}
    pick = min(d.rows, key=lambda r: r.choice.t).label
    record = load_top_up(ResultsStore.of(cfg))
    topped = len({t.label for r in record.rounds for t in r.topped}) if record is not None else 0
    return pick, theta, len(ResultsStore.of(cfg).runs()), topped


def probe_label(prompts: int, k: int, u: int) -> str:
    """The probe's candidate label of (P, k, u) at G = 8."""
    return f"P{prompts}xG8" + ("" if (k, u) == (0, 1) else f"-k{k}u{u}")


def _real_truth(inst: Instance) -> tuple[dict[str, float], dict[str, float]]:
    """(R_true per update, as nqm_async defines it; R_true read at step ends, as the probe reads)."""
    cfg, target = _cfg(inst)
    out, steps = {}, {}
    for p in PROBE_PROMPTS:
        b = 8 * p
        for k, u in itertools.product(PROBE_KS, PROBE_US):
            r = expected_async_samples_to_target(
                cfg, lr=lr_of(b), batch=b, delay=k, updates_per_batch=u, target_loss=target
            )
            lab = probe_label(p, k, u)
            out[lab] = r
            steps[lab] = expected_async_step_samples_to_target(
                cfg, lr=lr_of(b), batch=b, delay=k, updates_per_batch=u, target_loss=target
            )
    return out, steps


def _regrets(
    truth: dict[str, float], theta: dict[str, float], theta2: dict[str, float], picks: tuple[str, str]
) -> tuple[str, float, float]:
    """(best label, plain pick's regret, top-up pick's regret) under one truth of R."""
    t = {lab: truth[lab] / th for lab, th in theta.items() if th > 0}
    best = min(t, key=lambda lab: t[lab])
    return best, t[picks[0]] / t[best], truth[picks[1]] / theta2[picks[1]] / t[best]


def real_probe_lines() -> list[str]:
    import tempfile

    lines = [
        "",
        "through the real probe (run_probe on the NQM backend, its store, top-up record and recommend):",
        f"grid B {[8 * p for p in PROBE_PROMPTS]}, k {list(PROBE_KS)}, u {list(PROBE_US)}; plain = "
        f"{BASE} seeds (async_top_up_seeds {BASE}), top-up = the shipped defaults: {TOP} seeds within margin "
        f"{MARGIN}, then sequential rounds up to {MAX_SEEDS} seeds, "
        "rerun in the plain probe's results directory (its runs reused);",
        "truth: R_true at delay k (the backend's own dynamics) / the row's responses/s; R_true read per",
        "update (nqm_async's definition, part 1's truth) and, in the last three columns, at the step ends",
        "(E[L] after each batch's u updates: where the backend logs `loss`, so what the probe can see)",
        f"{'noise':>5} {'p':>4} {'gen:train':>9}  {'best':>14}  {'plain pick':>14} {'regret':>7}  "
        f"{'top-up pick':>14} {'regret':>7} {'runs':>9} {'topped':>6}  {'best (steps)':>14} {'plain':>6} "
        f"{'top-up':>6}",
    ]
    regs: list[list[float]] = [[], [], [], []]  # per update: plain, top-up; per step: plain, top-up
    runs = [0, 0]
    with tempfile.TemporaryDirectory() as tmp:
        for i, inst in enumerate(PROBE_INSTANCES):
            truth, steps = _real_truth(inst)
            root = Path(tmp) / str(i)
            plain, theta, n_plain, _ = _real_probe(inst, root, BASE)
            pick, theta2, n_top, topped = _real_probe(inst, root, TOP)
            best, r_plain, r_top = _regrets(truth, theta, theta2, (plain, pick))
            best_s, s_plain, s_top = _regrets(steps, theta, theta2, (plain, pick))
            for lst, v in zip(regs, (r_plain, r_top, s_plain, s_top), strict=True):
                lst.append(v)
            runs = [runs[0] + n_plain, runs[1] + n_top]
            ratio = inst.gen_per_resp_s / inst.train_per_resp_s
            lines.append(
                f"{inst.noise:5.1f} {inst.power:4.1f} {ratio:8.0f}:1  {best:>14}  "
                f"{plain:>14} {r_plain:7.3f}  "
                f"{pick:>14} {r_top:7.3f} {n_plain:>4}/{n_top:<4} {topped:6}  {best_s:>14} {s_plain:6.3f} "
                f"{s_top:6.3f}"
            )
    lines += [
        f"real probe: top-up max regret {max(regs[1]):.3f}, mean {sum(regs[1]) / len(regs[1]):.3f}; "
        f"plain max {max(regs[0]):.3f}; cost {runs[1] / runs[0]:.2f}x the plain probe's seed-runs",
        f"read at step ends: top-up max regret {max(regs[3]):.3f}, "
        f"mean {sum(regs[3]) / len(regs[3]):.3f}; plain max {max(regs[2]):.3f}, "
        f"mean {sum(regs[2]) / len(regs[2]):.3f}",
    ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
