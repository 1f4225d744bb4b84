"""The pre-training probe: one run per token batch and seed, through the same resumable results
store and run executor as `batchtune probe`, then the grid analysis (analysis/pretrain/grid.py).

A candidate's batch is ``prompts`` sequences of ``group_size = seq_len`` tokens, so a RunRecord's
``batch_responses`` is the batch in tokens and StepRecord ``samples`` are tokens. Runs stop at the
budget, or once the lowest target loss is confirmed reached. Then, where B_opt sits between grid
points, the refinement rounds add batches between them (measure/pretrain_refine.py).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from batchtune.analysis.pretrain.grid import GridAnalysis, GridCurve, analyse_grid
from batchtune.analysis.sample.lr import scaled_lr
from batchtune.backends.spec import Candidate
from batchtune.errors import InputError
from batchtune.events import ProbeEvents
from batchtune.measure import failed_starts
from batchtune.measure.one_run import execute_run
from batchtune.measure.plan import check_targets_reachable, lr_table, plan_pretrain, run_id
from batchtune.measure.pretrain_refine import RefineRound, refine_grid
from batchtune.measure.probe import check_manifest
from batchtune.measure.stop_rule import StopPolicy
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore
from batchtune.records.types import FAILED_STATUSES


@dataclass(frozen=True)
class PretrainProbeResult:
    analysis: GridAnalysis
    candidates: tuple[Candidate, ...]
    statuses: dict[str, str]  # run_id -> status
    runs_done: int
    wall_s: float
    results_dir: Path
    plot_path: Path | None = None
    refinement: tuple[RefineRound, ...] = ()  # the rounds that added batches (pretrain_refine.py)
    seq_len: int = 1  # batches are whole sequences of this many tokens


def run_pretrain_probe(
    recipe: Recipe, progress: ProbeEvents | None = None, *, refine: bool = False
) -> PretrainProbeResult:
    """The grid of ``recipe``, then, with ``refine`` (the study map's probe) and ``probe.refine``,
    its refinement rounds."""
    t0 = time.perf_counter()
    if not recipe.study.pretrain:
        raise InputError("the pre-training probe needs backend.training = 'pretrain'")
    check_targets_reachable(recipe)  # before the manifest: a refused recipe leaves nothing behind
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

    def run(pairs: Sequence[tuple[Candidate, int]]) -> int:
        done = 0
        for cand, seed in pairs:  # one process: torch already uses the cores
            if store.is_finished(run_id(cand, seed)):
                continue
            rec = execute_run(
                recipe, str(store.root), cand, seed, recipe.optimizer.lr, ref, policy, events=progress
            )
            done += rec is not None
        return done

    def run_batches(batches: Sequence[int], seeds: Sequence[int] | None = None) -> int:
        plan_b = plan_pretrain(with_batches(recipe, batches))
        added = [c for c in plan_b.candidates if c.batch_responses in set(batches)]
        cands.extend(c for c in added if c not in cands)
        pairs = [(c, s) for c in added for s in (recipe.budget.seeds if seeds is None else seeds)]
        if progress is not None:
            todo_b = sum(not store.is_finished(run_id(c, s)) for c, s in pairs)
            phase = f"refinement: batches {', '.join(str(b) for b in batches)}"
            phase += f", seeds {', '.join(map(str, seeds))}" if seeds is not None else ""
            info = {"total": len(pairs), "todo": todo_b, "max_samples": p.max_tokens, "phase": phase}
            progress("plan", info)
        return run(pairs)

    done = run(todo)
    rounds: tuple[RefineRound, ...] = ()
    if refine:
        rounds, extra = refine_grid(
            recipe,
            store,
            lambda batches, seeds: analyse_store_grid(store, recipe, batches, seeds),
            run_batches,
        )
        done += extra
    return PretrainProbeResult(
        analysis=analyse_store_grid(store, recipe),
        candidates=tuple(cands),
        statuses={r.run_id: r.status for r in store.runs()},
        runs_done=done,
        wall_s=time.perf_counter() - t0,
        results_dir=store.root,
        refinement=rounds,
        seq_len=p.seq_len,
    )


def with_batches(recipe: Recipe, batches: Sequence[int]) -> Recipe:
    """``recipe`` with ``batches`` (tokens) added to its grid: their candidates at the recipe's LR
    rule, from the same reference batch."""
    p = recipe.pretrain
    ref = recipe.lr_scaling.reference_batch or min(p.batches_tokens)
    grid = sorted({*p.batches_tokens, *(int(b) for b in batches)})
    return dataclasses.replace(
        recipe,
        pretrain=dataclasses.replace(p, batches_tokens=grid),
        lr_scaling=dataclasses.replace(recipe.lr_scaling, reference_batch=ref),
    )


def load_grid_curves(
    store: ResultsStore, batches: set[int] | None = None, seeds: set[int] | None = None
) -> tuple[list[GridCurve], float | None]:
    """The eval-loss curves of the store's finished runs (at ``batches`` and ``seeds`` only, when given)."""
    curves, floor = [], None
    for rec in store.runs():
        if rec.status in FAILED_STATUSES or (batches is not None and rec.batch_responses not in batches):
            continue
        if seeds is not None and rec.seed not in seeds:
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


def analyse_store_grid(
    store: ResultsStore, recipe: Recipe, batches: set[int] | None = None, seeds: set[int] | None = None
) -> GridAnalysis:
    curves, floor = load_grid_curves(store, batches, seeds)
    if not curves:
        raise InputError(f"{store.root} has no finished pre-training runs")
    ref = plan_pretrain(recipe).reference_batch
    smallest = min(c.batch_tokens for c in curves)
    return analyse_grid(
        curves,
        recipe.pretrain.targets,
        base_lr=scaled_lr(recipe.optimizer.lr, smallest, ref, recipe.lr_scaling.rule, lr_table(recipe)),
        lr_batch=smallest,  # the schedule's first stage runs at the rule's LR for its own batch
        rule=recipe.lr_scaling.rule if recipe.lr_scaling.rule != "table" else "sqrt",
        confidence=recipe.target.confidence,
        loss_floor=floor,
    )
