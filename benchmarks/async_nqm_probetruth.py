"""R as the probe defines it, exhaustively: each async NQM candidate at 256 seeds, read by the probe's
own code (issue 30's regret, under the estimand the tool declares).

The probe's R is the median over seeds of each run's samples-to-target (docs/method.md §3): a run
trains on the NQM backend until the shipped stop rule ends it (its target confirmed 25% past the
crossing, or the budget of 8192 samples, or a divergence), and its crossing is read from the steps
it logged. Run that on 256 seeds (10000..10255, none of which a probe draw uses) and the estimator
is the estimand: this is the truth a perfect probe of this recipe converges to. It differs from the
other truths of async_nqm_realprobe.py where runs are heavy-tailed:

- E[L] (the expected loss at step ends, or per update) counts every spike of every run. Near a
  candidate's stability edge a few runs spike now and then, and the mean loss crosses far later
  than a typical run does;
- "a typical run" there reads each run's crossing over a long simulated run (until the seed-mean
  loss crosses and as long again, at most 4000 updates), so a spike long after the run reached the
  target moves its crossing; the probe's run stops 25% past its crossing and never sees it.

Here the run is read exactly as a probe run is: the NQM backend (backends/nqm.py), the stop rule
(measure/stop_rule.py), the crossing and the median over seeds (analysis/sample/candidates.py; a
diverged seed censored, a seed at the budget censored). No band: the reference is not known here,
and a run outside it would be censored anyway. Per candidate it also counts the seeds that diverged
or spent the budget, and the seeds' quartiles: the tails that set the truths apart.

    python benchmarks/async_nqm_probetruth.py   (writes benchmarks/out/async_nqm_probetruth.{txt,json})
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

OUT = Path(__file__).resolve().parent / "out" / "async_nqm_probetruth.txt"
SEEDS = tuple(range(10000, 10256))
MORE_SEEDS = tuple(range(10256, 11280))  # the contenders' 1024 more (1280 in all)
CONTENDER = 1.15  # T within this factor of the least T at 256 seeds


def committed() -> dict[str, dict[str, float]] | None:
    """'set/i' -> label -> R under this truth, from the committed JSON (None before it exists)."""
    path = OUT.with_suffix(".json")
    if not path.exists():
        return None
    truth = json.loads(path.read_text())["truth"]
    return {key: {lab: v["r"] for lab, v in cands.items()} for key, cands in truth.items()}


def _recipe(name: str, i: int):  # type: ignore[no-untyped-def]
    import async_nqm_sequential as S
    from async_nqm_realprobe import _sets

    from batchtune.recipe.load import load_recipe

    return load_recipe("recipes/nqm.toml", S._probe_sets(_sets()[name][i], Path("unused"), S.TOP, 0))


def _runs(recipe, cand, reference_batch: int, seeds: tuple[int, ...]):  # type: ignore[no-untyped-def]
    """Each seed's run of ``cand``, trained and stopped as a probe run is (no store)."""
    from batchtune.analysis.sample.efficiency import RunData
    from batchtune.backends.nqm import NQMBackend
    from batchtune.backends.spec import RunSpec
    from batchtune.measure.one_run import _train
    from batchtune.measure.plan import run_id, run_record
    from batchtune.measure.stop_rule import NO_BAND, stop_policy

    policy = stop_policy(recipe, NO_BAND)
    out = []
    for seed in seeds:
        rid = run_id(cand, seed)
        spec = RunSpec(rid, cand, seed, recipe, Path("unused"), recipe.optimizer.lr, reference_batch)
        steps: list = []  # type: ignore[type-arg]
        stream = NQMBackend().train(spec)  # a generator, as the probe's _train takes
        run = _train(stream, steps.append, policy, lambda *a, **k: None, "responses")  # type: ignore[arg-type]
        last = run.curve.last
        record = run_record(
            cand, seed, recipe.optimizer.lr, reference_batch, run.status, run.reason, rid=rid,
            steps=last.step if last else 0, samples=last.samples if last else 0,
            tokens=last.tokens if last else 0, wall_s=0.0, backend="nqm", parallel_runs=1,
            cpu_cores=1, failed_start=False, **run.curve.totals,
        )  # fmt: skip
        out.append(RunData(record, tuple(steps)))
    return out


def _estimate(recipe, runs) -> dict[str, float]:
    """R (the probe's estimator over these runs), its interval, the seeds diverged / at the budget
    and the seeds' quartiles."""
    import numpy as np

    from batchtune.analysis.sample.candidates import candidates_from_runs
    from batchtune.errors import RunsFailed

    t = recipe.target
    try:
        (ce,) = candidates_from_runs(
            runs, metric=t.metric, target=t.value, higher_is_better=t.higher_is_better, ema_alpha=t.ema_alpha
        )
        est = ce.estimate
    except RunsFailed:  # every seed diverged: never reached
        est = None
    inf = float("inf")
    per_seed = est.per_seed if est else (None,) * len(runs)
    r = np.array([inf if v is None else v for v in per_seed])
    status = [x.record.status for x in runs]
    return {
        "r": est.samples_to_target if est else inf,
        "lo": est.ci_low if est else inf,
        "hi": est.ci_high if est else inf,
        "seeds": len(runs),
        "q25": float(np.quantile(r, 0.25)) if np.isfinite(np.quantile(r, 0.25)) else inf,
        "q75": float(np.quantile(r, 0.75)) if np.isfinite(np.quantile(r, 0.75)) else inf,
        "diverged": status.count("diverged"),
        "budget": status.count("budget_exhausted"),
    }


def task(job: tuple[str, int, dict[str, float]]) -> dict[str, dict[str, float]]:
    """label -> _estimate over SEEDS; the contenders (T within CONTENDER of the least, among the
    ranking's rows ``theta``: label -> responses/s) again over SEEDS + MORE_SEEDS."""
    from batchtune.measure.plan import plan_candidates

    name, i, theta = job
    recipe = _recipe(name, i)
    plan = plan_candidates(recipe)
    runs = {c.label: _runs(recipe, c, plan.reference_batch, SEEDS) for c in plan.candidates}
    out = {lab: _estimate(recipe, rs) for lab, rs in runs.items()}
    t = {lab: out[lab]["r"] / th for lab, th in theta.items() if th > 0}
    best = min(t.values())
    for cand in plan.candidates:
        if t.get(cand.label, float("inf")) <= CONTENDER * best:
            more = _runs(recipe, cand, plan.reference_batch, MORE_SEEDS)
            out[cand.label] = _estimate(recipe, runs[cand.label] + more)
    return out


def thetas() -> dict[str, dict[str, float]]:
    """'set/i' -> label -> responses/s of the ranking's rows, from the committed real-probe JSON
    (simulated step times: the same for every draw and either rule)."""
    from async_nqm_realprobe import OUT as REAL

    runs = json.loads(REAL.with_suffix(".json").read_text())["runs"]
    return {f"{r['name']}/{r['i']}": r["theta2"] for r in runs}


def render(truth: dict[str, dict[str, dict[str, float]]], wall: float) -> str:
    """Per instance: the best T under this truth, the contenders, and the tailed candidates."""
    th = thetas()
    lines = [
        f"R as the probe defines it: the median over {len(SEEDS)} seeds ({SEEDS[0]}..{SEEDS[-1]}) of each "
        "run's crossing, each run trained and stopped as a probe run is",
        "(NQM backend, shipped stop rule, budget 8192 samples, a diverged seed censored); T = R / the "
        "ranking's responses/s; the contenders (T within "
        f"{CONTENDER}x of the least) again",
        f"over {len(SEEDS) + len(MORE_SEEDS)} seeds; per contender: label, T / least T, R [90% interval]; "
        "tailed = candidates with a seed diverged or at the budget",
        f"machine: {platform.machine()} {os.cpu_count()} cores; two instances at a time; wall {wall:.0f} s",
        "",
        f"{'instance':>12} {'tailed':>6}  contenders",
    ]
    for key, cands in truth.items():
        t = {lab: cands[lab]["r"] / v for lab, v in th[key].items() if v > 0}
        best = min(t.values())
        tailed = sum(1 for v in cands.values() if v["diverged"] or v["budget"])
        cells = "; ".join(
            f"{lab} {t[lab] / best:.3f} {cands[lab]['r']:.0f} [{cands[lab]['lo']:.0f}-{cands[lab]['hi']:.0f}]"
            for lab in sorted(t, key=t.__getitem__)
            if t[lab] <= CONTENDER * best
        )
        lines.append(f"{key:>12} {tailed:>6}  {cells}")
    return "\n".join(lines) + "\n"


def main() -> int:
    from async_nqm_realprobe import SET_NAMES, _sets

    t0 = time.time()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sets = _sets()
    th = thetas()
    jobs = [(name, i, th[f"{name}/{i}"]) for name in SET_NAMES for i in range(len(sets[name]))]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        done = pool.map(task, jobs, chunksize=1)
    truth = {f"{n}/{i}": v for (n, i, _), v in zip(jobs, done, strict=True)}
    wall = time.time() - t0
    OUT.with_suffix(".json").write_text(json.dumps({"wall_s": wall, "truth": truth}, indent=1) + "\n")
    text = render(truth, wall)
    OUT.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
