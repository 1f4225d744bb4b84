"""Benchmark: B_opt and B_min recovery on hidden-style cases, with and without the probe's refinement.

    python benchmarks/pretrain_refine_recovery.py > benchmarks/out/pretrain_refine_recovery.txt

Part 1, exact three-stage data: 55 cases of Zhou et al.'s stable-phase E(S) = b/(S - S_min) +
A1 S + A0 (`analysis/pretrain/synth.ThreePhaseES`: B_min = A1 and B_opt = E_min/S_opt exactly),
parameters drawn from a seeded generator (seed 32; B_min 300..6,000 tokens, S_min 10..1,000
steps, B_opt 600..60,000), steps to the target at each batch exact (one seed) and then with 2%
multiplicative noise on each run's steps (3 seeds). Each case is probed as a pre-training grid
is: a doubling grid of 10 batches (256..131,072 tokens), then the probe's own refinement loop
(`measure/pretrain_refine.refine_grid`, default budget probe.refine_max_batches = 8).

Part 2, noisy loss curves of the SynthLaw family (`synth.SynthLaw`): 11 laws drawn with seed 2032,
5 target losses each (true B_opt log-uniform 1.5k..30k tokens), 3 paired seeds, 1% loss noise, 200
logs a run, steps read off each curve by the isotonic crossing (`analysis/pretrain/grid.analyse_grid`):
the grid alone against the refined grid (default budget, and a budget of 64 batches).

Per case: the reported B_opt within 15% of the truth, its 90% interval and bracket holding the
truth; B_min's ratio to the truth, its source, interval and bracket; the runs spent. Prints a table
per arm (--cases: every case's row too) and one JSON line. CPU: about a minute.
"""

# ruff: noqa: E501  (table layout)

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np
from scipy.optimize import brentq

from batchtune.analysis.pretrain.batch import estimate_batches
from batchtune.analysis.pretrain.grid import GridAnalysis, GridCurve, analyse_grid
from batchtune.analysis.pretrain.synth import SynthLaw, ThreePhaseES, synth_curves
from batchtune.measure.pretrain_refine import refine_grid
from batchtune.recipe.load import recipe_from_dict
from batchtune.records.store import ResultsStore

GRID = [256 * 2**i for i in range(10)]
DEFAULT_BUDGET = 8  # probe.refine_max_batches


def _recipe(targets: Sequence[float], seeds: Sequence[int], budget: int, refine_seeds: int = 0):  # type: ignore[no-untyped-def]
    data = {
        "backend": {"training": "pretrain"},
        "budget": {"seeds": list(seeds)},
        "probe": {"mode": "grid", "refine": True, "refine_max_batches": budget, "refine_seeds": refine_seeds},
        "pretrain": {"seq_len": 2, "batches_tokens": GRID, "max_tokens": 10**9, "targets": list(targets)},
    }
    return recipe_from_dict(data, "benchmark")


def _inside(ci: tuple | None, truth: float) -> bool | None:
    """None when there is no interval (one seed)."""
    return None if ci is None else (ci[0] or 0.0) <= truth <= ci[1]


def _count(rows: list[dict], key: str) -> int | str:
    vals = [r[key] for r in rows if r[key] is not None]
    return int(sum(vals)) if vals else "n/a (one seed: no interval)"


def _yn(x: bool | None) -> str:
    return "-" if x is None else ("y" if x else "N")


def _row(est, b_opt: float, b_min: float) -> dict:  # type: ignore[no-untyped-def]
    br = est.b_min_bracket
    mid = math.sqrt(br[0] * br[1]) if br and br[0] else math.nan
    return {
        "target": est.target_loss,
        "b_opt_true": b_opt,
        "b_opt_ratio": (est.b_opt_tokens or math.nan) / b_opt,
        "b_opt_within_15": est.b_opt_tokens is not None and abs(est.b_opt_tokens / b_opt - 1) <= 0.15,
        "b_opt_source": est.b_opt_source,
        "b_opt_ci_holds": _inside(est.b_opt_ci, b_opt),
        "b_opt_ci_width": math.nan if est.b_opt_ci is None else est.b_opt_ci[1] / est.b_opt_ci[0],
        "b_opt_ci_calibrated": est.b_opt_ci_kind.startswith("bootstrap"),
        "b_opt_bracket_holds": _inside(est.b_opt_bracket, b_opt),
        "b_min_true": b_min,
        "b_min_ratio": (est.b_min_tokens or math.nan) / b_min,
        "b_min_mid_ratio": mid / b_min,
        "b_min_source": est.b_min_source,
        "b_min_ci_holds": _inside(est.b_min_ci, b_min),
        "b_min_bracket_holds": _inside(est.b_min_bracket, b_min),
        "batches": len(est.batches_tokens),
    }


def summarise(name: str, rows: list[dict], runs: int, show: bool = False) -> dict:
    """One arm's figures (printed as a block, and returned); ``show``: every case's row too."""
    if show:
        for r in rows:
            print(
                f"  case {r['case']:2d} L {r['target']:.3f}: B_opt {r['b_opt_ratio']:.3f}x ({r['b_opt_source']}), "
                f"B_min {r['b_min_ratio']:.3f}x ({r['b_min_source']}), {r['batches']} batches"
            )
    ratio = np.array([r["b_opt_ratio"] for r in rows])
    mr = np.array([r["b_min_ratio"] for r in rows])
    mid = np.array([r["b_min_mid_ratio"] for r in rows])
    out = {
        "cases": len(rows),
        "runs": runs,
        "b_opt_within_15": int(sum(r["b_opt_within_15"] for r in rows)),
        "b_opt_ratio_median": round(float(np.nanmedian(ratio)), 4),
        "b_opt_abs_err_max": round(float(np.nanmax(np.abs(ratio - 1))), 4),
        "b_opt_ci_holds": _count(rows, "b_opt_ci_holds"),
        "b_opt_bracket_holds": _count(rows, "b_opt_bracket_holds"),
        "b_opt_ci_width_median": round(float(np.nanmedian([r["b_opt_ci_width"] for r in rows] or [math.nan])), 3),
        "b_opt_ci_bootstrap": int(sum(r["b_opt_ci_calibrated"] for r in rows)),
        "b_opt_ci_bootstrap_holds": int(sum(bool(r["b_opt_ci_holds"]) for r in rows if r["b_opt_ci_calibrated"])),
        "b_min_fit": int(sum(r["b_min_source"] == "fit" for r in rows)),
        "b_min_ratio_median": round(float(np.nanmedian(mr)), 4),
        "b_min_abs_err_median": round(float(np.nanmedian(np.abs(mr - 1))), 4),
        "b_min_abs_err_max": round(float(np.nanmax(np.abs(mr - 1))), 4),
        "b_min_within_10": int(np.sum(np.abs(mr - 1) <= 0.10)),
        "b_min_bracket_middle_ratio_median": round(float(np.nanmedian(mid)), 4),
        "b_min_ci_holds": _count(rows, "b_min_ci_holds"),
        "b_min_bracket_holds": _count(rows, "b_min_bracket_holds"),
    }
    print(f"\n{name}: {len(rows)} cases, {runs} runs")
    print(
        f"  B_opt within 15% of the truth: {out['b_opt_within_15']}/{len(rows)}  (median ratio {out['b_opt_ratio_median']:.3f}, "
        f"worst |error| {out['b_opt_abs_err_max']:.1%}); 90% interval holds it: {out['b_opt_ci_holds']}; bracket: {out['b_opt_bracket_holds']}"
    )
    if out["b_opt_ci_bootstrap"]:
        print(
            f"  B_opt 90% interval, bootstrap over seeds and fit window in {out['b_opt_ci_bootstrap']}/{len(rows)}: holds the truth in "
            f"{out['b_opt_ci_bootstrap_holds']} ({out['b_opt_ci_bootstrap_holds'] / out['b_opt_ci_bootstrap']:.1%}); "
            f"median width (upper/lower) {out['b_opt_ci_width_median']:.2f} over all with an interval"
        )
    print(
        f"  B_min from the fit in {out['b_min_fit']}/{len(rows)}; within 10%: {out['b_min_within_10']}/{len(rows)}  (median ratio "
        f"{out['b_min_ratio_median']:.3f}, median |error| {out['b_min_abs_err_median']:.1%}, worst {out['b_min_abs_err_max']:.1%}); "
        f"bracket's geometric middle: median ratio {out['b_min_bracket_middle_ratio_median']:.3f}"
    )
    print(f"  B_min 90% interval holds it: {out['b_min_ci_holds']}; bracket: {out['b_min_bracket_holds']}")
    return out


# ---- part 1: exact three-stage E(S) --------------------------------------------------------------


def draw_cases(n: int = 55, seed: int = 32) -> list[ThreePhaseES]:
    rng = np.random.default_rng(seed)
    cases: list[ThreePhaseES] = []
    while len(cases) < n:
        a1 = math.exp(rng.uniform(math.log(300), math.log(6000)))
        s_min = math.exp(rng.uniform(math.log(10), math.log(1000)))
        u = math.exp(rng.uniform(math.log(0.2), math.log(5)))  # sqrt(b a1) / (a1 s_min)
        w = rng.uniform(0, 6)  # a0 / (a1 s_min)
        c = ThreePhaseES(b=(u * a1 * s_min) ** 2 / a1, s_min=s_min, a1=a1, a0=w * a1 * s_min)
        if 600 < c.b_opt() < 60000:
            cases.append(c)
    return cases


class StepsProbe:
    """Runs of one case: the steps to the target at a batch, per seed (exact, or noisy per run)."""

    def __init__(self, steps_at: Callable[[float], float], seeds: Sequence[int], noise: float, case: int):
        self.steps_at, self.seeds, self.noise, self.case = steps_at, list(seeds), noise, case
        self.steps: dict[int, dict[int, float]] = {}

    def run_batches(self, batches: Sequence[int], seeds: Sequence[int] | None = None) -> int:
        done = 0
        for b in batches:
            runs = self.steps.setdefault(b, {})
            if seeds is None and not runs:  # the recipe's seeds: one draw per batch (as before)
                rng = np.random.default_rng([self.case, b])  # a run's noise does not depend on the order
                noise = np.exp(rng.normal(0.0, self.noise, len(self.seeds)))
                runs.update({s: self.steps_at(float(b)) * x for s, x in zip(self.seeds, noise, strict=True)})
                done += len(self.seeds)
            for s in [s for s in seeds or () if s not in runs]:  # a seed round's seeds
                x = np.random.default_rng([self.case, b, s]).normal(0.0, self.noise)
                runs[s] = self.steps_at(float(b)) * math.exp(x)
                done += 1
        return done

    def analyse(self, batches: set[int] | None = None, seeds: set[int] | None = None) -> GridAnalysis:
        bs = sorted(b for b in self.steps if batches is None or b in batches)
        use = sorted({s for b in bs for s in self.steps[b] if seeds is None or s in seeds})
        steps = np.array([[self.steps[b].get(s, np.nan) for b in bs] for s in use])
        ran = np.array([[s in self.steps[b] for b in bs] for s in use])
        est = estimate_batches(bs, steps, 1.0, rng_seed=self.case, ran_per_seed=ran)
        return GridAnalysis((est,), (), (), None)


def part1(
    cases: list[ThreePhaseES], seeds: Sequence[int], noise: float, budget: int | None, refine_seeds: int = 0
) -> tuple[list[dict], int]:
    rows, runs = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, c in enumerate(cases):
            probe = StepsProbe(lambda b, c=c: float(c.steps_to([b])[0]), seeds, noise, i)
            runs += probe.run_batches(GRID)
            if budget is not None:
                _, done = refine_grid(
                    _recipe([1.0], seeds, budget, refine_seeds),
                    ResultsStore(f"{tmp}/c{i}"),
                    probe.analyse,
                    probe.run_batches,
                )
                runs += done
            rows.append({"case": i, **_row(probe.analyse().estimates[0], c.b_opt(), c.b_min())})
    return rows, runs


# ---- part 2: noisy loss curves of the SynthLaw family ---------------------------------------------


def draw_laws(n: int = 11, seed: int = 2032) -> list[tuple[SynthLaw, list[float]]]:
    rng = np.random.default_rng(seed)
    out: list[tuple[SynthLaw, list[float]]] = []
    while len(out) < n:
        law = SynthLaw(
            l_inf=float(rng.uniform(1.5, 2.5)),
            sigma=float(rng.uniform(0.5, 1.5)),
            alpha=float(rng.uniform(0.3, 0.7)),
            b_ref_tokens=float(np.exp(rng.uniform(np.log(256), np.log(2048)))),
            b_noise_tokens=float(np.exp(rng.uniform(np.log(2048), np.log(65536)))),
            tau_steps=float(rng.uniform(100, 400)),
        )
        targets = [_target_for(law, float(b)) for b in np.geomspace(1500, 30000, 5)]
        if all(t is not None for t in targets):
            out.append((law, [float(t) for t in targets if t is not None]))
    return out


def _target_for(law: SynthLaw, b_opt: float) -> float | None:
    f = lambda t: math.log(law.b_opt(t)) - math.log(b_opt)  # noqa: E731
    lo, hi = law.l_inf + 1e-3, law.l0 - 1e-3
    try:
        return float(brentq(f, lo, hi, xtol=1e-10)) if f(lo) * f(hi) < 0 else None
    except (ValueError, OverflowError):
        return None


class CurveProbe:
    """Runs of one law: noisy loss curves at a batch, one per seed (0, 1, 2; a seed round's more)."""

    def __init__(self, law: SynthLaw, targets: list[float], max_tokens: float, case: int):
        self.law, self.targets, self.max_tokens, self.case = law, targets, max_tokens, case
        self.curves: dict[int, dict[int, GridCurve]] = {}

    def run_batches(self, batches: Sequence[int], seeds: Sequence[int] | None = None) -> int:
        done = 0
        for b in batches:
            runs = self.curves.setdefault(b, {})
            for seed in [s for s in (seeds if seeds is not None else range(3)) if s not in runs]:
                stream = (self.case * 10 + seed) * 1_000_003 + b  # one noise stream per run (seed < 10)
                ((_, _, tok, loss),) = synth_curves(
                    self.law, [float(b)], [stream], max_tokens=self.max_tokens, noise_rel=0.01
                )
                runs[seed] = GridCurve(float(b), seed, tuple(tok), tuple(loss))
                done += 1
        return done

    def analyse(self, batches: set[int] | None = None, seeds: set[int] | None = None) -> GridAnalysis:
        keep = [
            c
            for b, cs in self.curves.items()
            if batches is None or b in batches
            for s, c in cs.items()
            if seeds is None or s in seeds
        ]
        return analyse_grid(keep, self.targets, base_lr=1e-3)


def part2(
    laws: list[tuple[SynthLaw, list[float]]], budget: int | None, refine_seeds: int = 0
) -> tuple[list[dict], int]:
    rows, runs = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (law, ts) in enumerate(laws):
            e_max = max(float(np.nanmin(np.asarray(GRID) * law.steps_to(t, GRID))) for t in ts)
            probe = CurveProbe(law, ts, 40 * e_max, i)
            runs += probe.run_batches(GRID)
            if budget is not None:
                _, done = refine_grid(
                    _recipe(ts, [0, 1, 2], budget, refine_seeds),
                    ResultsStore(f"{tmp}/l{i}"),
                    probe.analyse,
                    probe.run_batches,
                )
                runs += done
            for est in probe.analyse().estimates:
                rows.append({"case": i, **_row(est, law.b_opt(est.target_loss), law.b_min(est.target_loss))})
    return rows, runs


def main() -> None:
    import sys

    args = sys.argv[1:]
    show = "--cases" in args
    law_seed = int(args[args.index("--law-seed") + 1]) if "--law-seed" in args else 2032
    t0 = time.perf_counter()
    summary: dict = {}
    if "--curves-only" not in args:
        cases = draw_cases()
        print("Part 1: exact three-stage E(S), 55 cases (seed 32)")
        for name, seeds, noise, budget, more in (
            ("exact, doubling grid", [0], 0.0, None, 0),
            ("exact, refined (budget 8)", [0], 0.0, DEFAULT_BUDGET, 0),
            ("2% noise on steps, 3 seeds, doubling grid", [0, 1, 2], 0.02, None, 0),
            ("2% noise on steps, 3 seeds, refined (budget 8)", [0, 1, 2], 0.02, DEFAULT_BUDGET, 0),
            ("2% noise on steps, refined (budget 8), 6 seeds beside B_opt", [0, 1, 2], 0.02, DEFAULT_BUDGET, 6),
        ):
            rows, runs = part1(cases, seeds, noise, budget, more)
            summary[name] = summarise(name, rows, runs, show)
    print(f"\nPart 2: noisy loss curves (1% loss noise, 3 seeds), 11 SynthLaw laws x 5 targets (seed {law_seed})")
    laws = draw_laws(seed=law_seed)
    for name, budget, more in (
        ("curves, doubling grid", None, 0),
        ("curves, refined (budget 8)", DEFAULT_BUDGET, 0),
        ("curves, refined (budget 8), 6 seeds beside B_opt", DEFAULT_BUDGET, 6),
        ("curves, refined (budget 64)", 64, 0),
    ):
        rows, runs = part2(laws, budget, more)
        summary[name] = summarise(name, rows, runs)
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    print("\n" + json.dumps(summary))


if __name__ == "__main__":
    main()
