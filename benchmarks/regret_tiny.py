"""Regret on tiny-grpo / tiny-ppo against exhaustive runs (benchmarks/regret.py --tiny).

Truth: every candidate of the recipe run to the target (no band stop, no sequential seeds,
budget.max_samples 65536) at ``seeds`` (disjoint from the probe's), cached under
benchmarks/cache/<recipe>-exhaustive (a results directory: a rerun reuses finished runs and
resumes unfinished ones). True R(B): the median over those seeds. Θ(B): measured by profile-gen
on this machine (the tiny trainer has no time model to take a truth from), the same Θ the tool
ranks with, so the regret here measures the error that comes from R alone.
The tool: the recipe's own probe (its seeds, band stop and sequential seeding), profile-gen and
recommend, cached under benchmarks/cache/<recipe>-probe.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
from regret_cases import CaseResult, _result

from batchtune.measure.probe import run_probe
from batchtune.measure.profile import run_profile
from batchtune.recipe.load import load_recipe
from batchtune.records.store import ResultsStore
from batchtune.workflow.recommend import recommend_for_recipe

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks" / "cache"


def exhaustive_truth(name: str, seeds: list[int]):
    """Every candidate of recipes/<name>.toml run to the target (no band stop, no sequential seeds,
    65,536 samples at most) at ``seeds``, cached under benchmarks/cache/<name>-exhaustive (a rerun
    reuses finished runs): the probe's SampleEfficiency over them."""
    ex_dir = CACHE / f"{name}-exhaustive"
    exhaustive = load_recipe(
        ROOT / "recipes" / f"{name}.toml",
        [
            f"budget.seeds={seeds}",
            "budget.stop_outside_band=false",
            "budget.max_extra_seeds=0",
            "budget.max_samples=65536",
            f"run.results_dir={ex_dir}",
        ],
    )
    return run_probe(exhaustive).efficiency


def run_tiny_case(name: str, seeds: list[int]) -> CaseResult:
    t0 = time.perf_counter()
    recipe = ROOT / "recipes" / f"{name}.toml"
    truth = exhaustive_truth(name, seeds)
    pr_dir = CACHE / f"{name}-probe"
    cfg = load_recipe(recipe, [f"run.results_dir={pr_dir}"])
    run_probe(cfg)
    store = ResultsStore(pr_dir)
    if not store.throughput():
        run_profile(cfg, store)
    rec, _, _ = recommend_for_recipe(cfg, "auto", None, 1)
    main = sorted((c for c in truth.candidates if c.family == "main"), key=lambda c: c.batch_responses)
    batches = np.array([c.batch_responses for c in main], float)
    r = np.array([c.estimate.samples_to_target if c.estimate else math.inf for c in main])
    thr = rec.throughput.per_candidate
    t = np.array([r[i] / thr[c.label].responses_per_s for i, c in enumerate(main)])
    crit = truth.critical
    crossing = crit.crossing if crit is not None and crit.crossing is not None else math.nan
    out = _result("tiny", name, batches, r, t, rec, cfg.target.tolerance, crossing, t0)
    print(f"# {name}: exhaustive R per batch {dict(zip(batches, r, strict=True))}", file=sys.stderr)
    return out
