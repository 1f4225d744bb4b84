"""The pre-training probe: one run per token batch and seed, through the same resumable results
store and run executor as `batchtune probe`, then the grid analysis (analysis/pretrain/grid.py).

A candidate's batch is ``prompts`` sequences of ``group_size = seq_len`` tokens, so a RunRecord's
``batch_responses`` is the batch in tokens and StepRecord ``samples`` are tokens. Runs stop at the
budget, or once the lowest target loss is confirmed reached.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from batchtune.analysis.pretrain.grid import GridAnalysis, GridCurve, analyse_grid
from batchtune.analysis.sample.lr import scaled_lr
from batchtune.backends.spec import Candidate
from batchtune.errors import InputError
from batchtune.events import ProbeEvents
from batchtune.measure import failed_starts
from batchtune.measure.one_run import execute_run
from batchtune.measure.plan import lr_table, plan_pretrain, run_id
from batchtune.measure.probe import check_manifest
from batchtune.measure.stop_rule import StopPolicy
from batchtune.recipe.schema import Recipe
from batchtune.records import FAILED_STATUSES, ResultsStore


@dataclass(frozen=True)
class PretrainProbeResult:
    analysis: GridAnalysis
    candidates: tuple[Candidate, ...]
    statuses: dict[str, str]  # run_id -> status
    runs_done: int
    wall_s: float
    results_dir: Path
    plot_path: Path | None = None


def run_pretrain_probe(recipe: Recipe, progress: ProbeEvents | None = None) -> PretrainProbeResult:
    t0 = time.perf_counter()
    if not recipe.study.pretrain:
        raise InputError("the pre-training probe needs backend.training = 'pretrain'")
    store = ResultsStore.of(recipe)
    check_manifest(store, recipe)
    failed_starts.reopen(store, progress)  # a run that could not start measured nothing: run it again
    plan = plan_pretrain(recipe)
    cands, ref = list(plan.candidates), plan.reference_batch
    p = recipe.pretrain
    policy = StopPolicy(
        metric="eval_loss",
        target=min(p.targets) if p.targets else -math.inf,
        higher_is_better=False,
        ema_alpha=recipe.target.ema_alpha,
        max_samples=p.max_tokens,
        stop_at_target=bool(p.targets),
        band_samples=math.inf,
    )
    jobs = [(c, s) for c in cands for s in recipe.budget.seeds]
    todo = [(c, s) for c, s in jobs if not store.is_finished(run_id(c, s))]
    if progress is not None:
        progress("plan", {"total": len(jobs), "todo": len(todo), "max_samples": p.max_tokens})
    done = 0
    for cand, seed in todo:  # one process: torch already uses the cores
        done += (
            execute_run(
                recipe, str(store.root), cand, seed, recipe.optimizer.lr, ref, policy, events=progress
            )
            is not None
        )
    return PretrainProbeResult(
        analysis=analyse_store_grid(store, recipe),
        candidates=tuple(cands),
        statuses={r.run_id: r.status for r in store.runs()},
        runs_done=done,
        wall_s=time.perf_counter() - t0,
        results_dir=store.root,
    )


def load_grid_curves(store: ResultsStore) -> tuple[list[GridCurve], float | None]:
    curves, floor = [], None
    for rec in store.runs():
        if rec.status in FAILED_STATUSES:
            continue
        pts = [
            (s.samples, s.metrics["eval_loss"]) for s in store.steps(rec.run_id) if "eval_loss" in s.metrics
        ]
        for s in store.steps(rec.run_id):
            floor = s.metrics.get("loss_floor", floor)
            break
        if pts:
            tok, loss = zip(*pts, strict=True)
            curves.append(GridCurve(float(rec.batch_responses), rec.seed, tok, loss))
    return curves, floor


def analyse_store_grid(store: ResultsStore, recipe: Recipe) -> GridAnalysis:
    curves, floor = load_grid_curves(store)
    if not curves:
        raise InputError(f"{store.root} has no finished pre-training runs")
    ref = plan_pretrain(recipe).reference_batch
    return analyse_grid(
        curves,
        recipe.pretrain.targets,
        base_lr=scaled_lr(
            recipe.optimizer.lr,
            min(c.batch_tokens for c in curves),
            ref,
            recipe.lr_scaling.rule,
            lr_table(recipe),
        ),
        rule=recipe.lr_scaling.rule if recipe.lr_scaling.rule != "table" else "sqrt",
        confidence=recipe.target.confidence,
        loss_floor=floor,
    )
