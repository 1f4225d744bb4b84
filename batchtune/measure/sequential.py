"""Sequential seeding: more seeds only where a verdict is undecided (docs/method.md §3.2).

After the probe's planned runs, a batch whose R(B)/R(B0) interval straddles 1 + tol
("inconclusive") gets one more seed, and so does the reference batch: the ratio pairs seeds by
seed id (analysis/sample/critical.py), so an extra seed at B alone would not narrow it. Then the probe is
analysed again, and the next round adds a seed to the batches still inconclusive, until none is
or ``budget.max_extra_seeds`` rounds are spent. Round k uses seed ``max(budget.seeds) + k`` for
every batch it touches, so the extra runs of a batch and of the reference share seed ids.

No round is spent when no outcome of the rounds left could give a verdict: a reference that never
reached the target in most of its seeds (R0 = inf, so no batch has a ratio to it) gets a finite
median only if more than half of all its seeds reach it, and when even every remaining round
reaching it would leave half or more censored, more seeds cannot help (`reference_can_settle`).

Resumable like the rest of the probe: every round's decision is a function of the finished runs,
so a rerun replays the same rounds and redoes only unfinished runs. What was spent is derived from
the store (runs whose seed is not in ``budget.seeds``), so `probe` and `recommend` report it alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from batchtune.analysis.sample.efficiency import RunData, SampleEfficiency
from batchtune.analysis.sample.ratio import INCONCLUSIVE
from batchtune.backends.spec import Candidate
from batchtune.events import ProbeEvents
from batchtune.measure.execute import RunFn, run_jobs
from batchtune.measure.plan import Plan, run_id
from batchtune.measure.stop_rule import NO_BAND, StopPolicy, stop_policy
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore


def extra_seed(recipe: Recipe, round_: int) -> int:
    """The seed id of sequential round ``round_`` (1-based): past every planned seed."""
    return max(recipe.budget.seeds) + round_


def undecided(eff: SampleEfficiency) -> list[str]:
    """Labels of the candidates whose verdict is inconclusive, in the order of the analysis."""
    return [c.label for c in eff.candidates if c.verdict is not None and c.verdict.status == INCONCLUSIVE]


def reference_can_settle(eff: SampleEfficiency, rounds_left: int) -> bool:
    """Whether the reference's samples-to-target can become finite within ``rounds_left`` more
    seeds (one per round): always when it is finite already. With R0 = inf (its median over the
    usable seeds is censored), the median of n seeds, k of them censored, is finite exactly when
    2k < n; the best the rounds can do is reach in every new seed, giving n + rounds_left seeds
    with the same k. When even that leaves 2k >= n + rounds_left, no ratio to the reference, and
    so no verdict, can come out of more seeds."""
    est = eff.get(eff.reference).estimate
    if est is None:  # every reference run failed: the analysis says so; seeds will not decide
        return False
    if math.isfinite(est.samples_to_target):
        return True
    return 2 * est.n_censored < est.n_seeds + rounds_left


def add_seeds(
    recipe: Recipe,
    store: ResultsStore,
    plan: Plan,
    run_fn: RunFn,
    analyse: Callable[[ResultsStore, Recipe, Plan], SampleEfficiency],
    policy: Callable[[], StopPolicy],
    progress: ProbeEvents | None = None,
) -> int:
    """Run the sequential rounds (module docstring); returns the number of runs executed here.

    ``analyse`` is measure.probe.analyse_store and ``policy()`` its stop policy for non-reference
    runs (computed once a round, after the reference's new seed: the band narrows as its seeds
    grow), passed in so this module does not import measure.probe. The reference runs unbanded.
    """
    no_band = stop_policy(recipe, NO_BAND)
    cap = recipe.budget.max_extra_seeds
    done = 0
    by_label = plan.by_label()
    ref = by_label.get(plan.reference)
    if cap <= 0 or ref is None:
        return 0
    for k in range(1, cap + 1):
        eff = analyse(store, recipe, plan)
        labels = [lab for lab in undecided(eff) if lab in by_label]
        if not labels or not reference_can_settle(eff, cap - k + 1):
            break
        seed = extra_seed(recipe, k)
        ref_job: list[tuple[Candidate, int]] = [(ref, seed)]
        rest = [(by_label[lab], seed) for lab in labels if lab != plan.reference]
        todo_ref = [(c, s) for c, s in ref_job if not store.is_finished(run_id(c, s))]
        todo = [(c, s) for c, s in rest if not store.is_finished(run_id(c, s))]
        if progress is not None and (todo_ref or todo):
            progress(
                "plan",
                {
                    "total": len(todo_ref) + len(todo),
                    "todo": len(todo_ref) + len(todo),
                    "max_samples": recipe.budget.max_samples,
                    "phase": f"extra seed {seed}: {', '.join(c.label for c, _ in [*todo_ref, *todo])}",
                },
            )
        done += run_jobs(run_fn, recipe, store, plan.reference_batch, todo_ref, no_band, progress)
        if todo:  # the band once per round, after the reference's new seed
            done += run_jobs(run_fn, recipe, store, plan.reference_batch, todo, policy(), progress)
    return done


def extra_seed_counts(runs: Sequence[RunData], seeds: Sequence[int]) -> dict[str, int]:
    """Per candidate label, the finished runs whose seed is not a planned one (the extra seeds)."""
    out: dict[str, int] = {}
    for r in _extra(runs, seeds):
        out[r.record.candidate] = out.get(r.record.candidate, 0) + 1
    return out


def _extra(runs: Sequence[RunData], seeds: Sequence[int]) -> list[RunData]:
    """The probe's runs at seeds it did not plan (an imported run's seed is the log's, not a round
    of sequential seeding)."""
    planned = set(seeds)
    return [r for r in runs if r.record.seed not in planned and not r.record.imported]


def with_extra_seeds(
    eff: SampleEfficiency, runs: Sequence[RunData], seeds: Sequence[int]
) -> SampleEfficiency:
    """``eff`` with ``extra_seeds`` filled in and a note saying what sequential seeding spent."""
    counts = extra_seed_counts(runs, seeds)
    if not counts:
        return eff
    spent = sum(r.record.samples for r in _extra(runs, seeds))
    shown = ", ".join(f"{c.label} +{counts[c.label]}" for c in eff.candidates if counts.get(c.label, 0) > 0)
    note = (
        f"sequential seeding (budget.max_extra_seeds): extra seeds where a verdict was inconclusive, "
        f"with the reference paired: {shown}; {sum(counts.values())} runs, {spent:,} samples"
    )
    return dataclasses.replace(eff, extra_seeds=counts, notes=(*eff.notes, note))
