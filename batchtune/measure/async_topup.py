"""The async probe's seed top-up (analysis/decide/async_topup.py's rule, run for real): after the
planned and sequential seeds, the candidates whose predicted time-to-target is within a margin of the
best are brought to ``budget.async_top_up_seeds`` seeds, round after round, until no contender lacks
seeds. Only a recipe with async or off-policy knobs (``has_async_knobs``) tops up.

Estimates: the joint ranking (analysis/decide/async_joint.py) over the store's runs, with the probe's
own step times (a profile, if `tune` runs one, comes after the probe; `recommend` may then rank on
other times, and says where its times come from). A candidate's T is its best row's.

Seeds: a top-up to N seeds runs the planned seeds and the seeds of sequential rounds 1 .. N - planned
(``sequential.extra_seed``), so its runs share seed ids with sequential seeding's (reused where they
exist) and with the other candidates'. The reference runs unbanded, the others under the probe's
band, as sequential seeding runs them.

Sequential rounds (``budget.async_top_up_max_seeds`` above ``async_top_up_seeds``, the default): the
paired seeds' evidence is the ranking made again with each of the rule's GROUPS groups of the seed
list left out (``analyse`` with ``drop_seeds``); a round brings its candidates to a seed count N of
the same seed list (``top_up_seeds``).

Resumable and recorded: each round (its candidates and their seed count) is written to
``<results>/async_topup.json`` before its runs start; a rerun first finishes the recorded rounds'
runs, then goes on from there, so `recommend` reports the rounds that were run (the record:
measure/topup_record.py). A record of another margin, seed count or cap is started afresh (the runs
it made are kept and count as seeds; every cap <= the seed count is the same: no sequential rounds,
so a finished record is kept, and not rewritten). Only the plan's candidates are compared: not the
runs of one the edited recipe dropped.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from batchtune.events import ProbeEvents
from batchtune.measure.execute import RunFn, run_jobs
from batchtune.measure.plan import Plan, run_id
from batchtune.measure.sequential import extra_seed
from batchtune.measure.stop_rule import NO_BAND, StopPolicy, stop_policy
from batchtune.measure.topup_record import TopUpRecord, load_top_up, save_top_up
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore
from batchtune.records.types import FAILED_STATUSES, on_policy_updates

if TYPE_CHECKING:
    from batchtune.analysis.decide.async_joint import Knobs, Trace
    from batchtune.analysis.decide.async_topup import TopUpEnd, TopUpRound
    from batchtune.analysis.sample.efficiency import SampleEfficiency


class Analyse(Protocol):
    """measure/probe.analyse_store's shape: the sample efficiency of the store's runs, less those of
    ``drop_seeds``."""

    def __call__(
        self, store: ResultsStore, recipe: Recipe, plan: Plan, *, drop_seeds: frozenset[int] = ...
    ) -> SampleEfficiency: ...


def has_async_knobs(cfg: Recipe) -> bool:
    """Whether ``cfg`` runs anything but synchronous on-policy training: a staleness k > 0, updates
    per batch other than its mini-batches, or the two-process mode."""
    p, m = cfg.probe, cfg.algorithm.mini_batches
    return (
        cfg.algorithm.mode == "async"
        or any(k != 0 for k in p.staleness)
        or any(u != m for u in p.updates_per_batch)
        or p.async_sweep == "auto"
    )


def run_knobs(store: ResultsStore) -> dict[str, Knobs]:
    """Per candidate: the staleness and updates per batch its runs recorded, and the median seconds
    of one weight sync over the steps that synced (0 when none did: one process). A probe's run gives
    them before a log imported under its label (at another u, before import-logs split those apart)."""
    from batchtune.analysis.decide.async_joint import Knobs

    first: dict[str, Knobs] = {}
    syncs: dict[str, list[float]] = defaultdict(list)
    for rec in sorted(store.runs(), key=lambda r: r.imported):  # stable: by run id within
        if rec.status in FAILED_STATUSES:
            continue
        first.setdefault(rec.candidate, Knobs(rec.staleness, rec.updates_per_batch))
        for step in store.steps(rec.run_id):
            s = step.metrics.get("sync_s", 0.0)
            if s > 0:
                syncs[rec.candidate].append(s)
    return {
        lab: dataclasses.replace(kn, sync_s=statistics.median(syncs[lab]) if syncs[lab] else 0.0)
        for lab, kn in first.items()
    }


def top_up_seeds(recipe: Recipe, n: int | None = None) -> list[int]:
    """The seed ids of a candidate topped up to ``n`` seeds (default ``budget.async_top_up_seeds``):
    the planned seeds, then those of sequential rounds 1, 2, ..."""
    planned = list(recipe.budget.seeds)
    n = recipe.budget.async_top_up_seeds if n is None else n
    return planned + [extra_seed(recipe, r) for r in range(1, n - len(planned) + 1)]


@dataclasses.dataclass(frozen=True)
class _StoreFacts:
    """What the ranking reads from the store besides the sample efficiency (read once per round)."""

    parallel: dict[str, int]
    seeds: dict[str, int]
    knobs: dict[str, Knobs]
    traces: Mapping[str, Trace]
    on_policy_u: dict[tuple[int, int], int]  # per (P, G): its on-policy runs' u (types.on_policy_updates)

    @classmethod
    def of(cls, store: ResultsStore) -> _StoreFacts:
        from batchtune.measure.async_sweep import stored_traces

        parallel: dict[str, int] = {}
        runs = store.runs()
        for r in runs:
            parallel[r.candidate] = max(parallel.get(r.candidate, 0), r.parallel_runs)
        return cls(
            parallel, seeds_by_label(store), run_knobs(store), stored_traces(store), on_policy_updates(runs)
        )


def estimates(
    recipe: Recipe, store: ResultsStore, eff: SampleEfficiency, facts: _StoreFacts | None = None
) -> tuple[dict[str, float], dict[str, int]]:
    """(each ranked candidate's best predicted T, its finished seeds) from the store's runs."""
    from batchtune.analysis.decide.async_joint import joint_decision
    from batchtune.analysis.decide.async_topup import best_times
    from batchtune.analysis.decide.recommend import throughput_from_probe
    from batchtune.errors import AnalysisError

    f = _StoreFacts.of(store) if facts is None else facts
    a = recipe.algorithm
    two = a.mode == "async"
    try:
        thr = throughput_from_probe(eff.candidates, recipe.generation.other_s_per_step, f.parallel)
        decision = joint_decision(
            eff, thr, f.knobs, mini_batches=a.mini_batches, two_process=two,
            sync_every=a.runs_sync_every, traces=f.traces, on_policy_u=f.on_policy_u,
        )  # fmt: skip
    except AnalysisError:  # nothing to rank yet (no timed on-policy estimate): no contender
        return {}, f.seeds
    return best_times([(row.label, row.choice.t) for row in decision.rows]), f.seeds


def add_async_seeds(
    recipe: Recipe,
    store: ResultsStore,
    plan: Plan,
    run_fn: RunFn,
    analyse: Analyse,
    policy: Callable[[], StopPolicy],
    progress: ProbeEvents | None = None,
) -> int:
    """Run the top-up rounds (module docstring); returns the number of runs executed here.
    ``analyse`` and ``policy`` as in sequential.add_seeds (``analyse`` also takes ``drop_seeds``)."""
    from batchtune.analysis.decide.async_topup import SeqRule, top_up

    b = recipe.budget
    if not has_async_knobs(recipe) or b.async_top_up_seeds <= len(b.seeds):
        return 0
    by_label, old = plan.by_label(), load_top_up(store)
    fresh = TopUpRecord(b.async_top_up_margin, b.async_top_up_seeds, (), cap=b.async_top_up_max_seeds)
    # a kept record's end is found again below, cleared on disk before a run outdates it
    rec = dataclasses.replace(old, end=None) if old is not None and old.rule() == fresh.rule() else fresh
    ran = 0

    def run(labels: list[str], n: int) -> None:
        nonlocal ran
        cands = [by_label[lab] for lab in labels if lab in by_label]
        clear = lambda: save_top_up(store, dataclasses.replace(rec, end=None))  # noqa: E731
        ran += _run_top_up(recipe, store, plan, cands, n, run_fn, policy, progress, clear)

    def record(rnd: TopUpRound) -> None:
        nonlocal rec
        rec = dataclasses.replace(rec, rounds=(*rec.rounds, rnd), end=None)
        save_top_up(store, rec)

    def ended(end: TopUpEnd) -> None:
        nonlocal rec
        rec = dataclasses.replace(rec, end=end)
        save_top_up(store, rec)

    for rnd in rec.rounds:  # a resumed probe: the recorded rounds' runs first
        run([t.label for t in rnd.topped], rnd.seeds or rec.top)
    if old is None or dataclasses.replace(old, end=None) != rec:  # a finished probe rerun writes nothing
        save_top_up(store, rec)

    def estimate() -> tuple[dict[str, float], dict[str, int]]:
        # the planned candidates only: a resume after the recipe dropped some finds their runs
        t, seeds = estimates(recipe, store, analyse(store, recipe, plan))
        return {lab: v for lab, v in t.items() if lab in by_label}, seeds

    top_up(
        estimate,
        run,
        margin=rec.margin,
        top=rec.top,
        seq=SeqRule(cap=rec.cap) if rec.cap > rec.top else None,
        evidence=lambda labels: group_estimates(recipe, store, plan, analyse, labels, rec.cap),
        asked=rec.asked(),
        on_round=record,
        on_end=ended,
    )
    return ran


def group_estimates(
    recipe: Recipe, store: ResultsStore, plan: Plan, analyse: Analyse, labels: list[str], cap: int
) -> dict[str, list[float]]:
    """Per label, its T with group j of the seed list left out, j = 0 .. GROUPS - 1 (group j: the
    seeds at positions i of ``top_up_seeds(recipe, cap)`` with i % GROUPS == j, the same seed ids
    for every candidate: paired); inf where that ranking has no T for it."""
    from batchtune.analysis.decide.async_topup import GROUPS

    ids = top_up_seeds(recipe, cap)
    facts = _StoreFacts.of(store)
    out: dict[str, list[float]] = {lab: [] for lab in labels}
    for j in range(GROUPS):
        drop = frozenset(s for i, s in enumerate(ids) if i % GROUPS == j)
        t, _ = estimates(recipe, store, analyse(store, recipe, plan, drop_seeds=drop), facts)
        for lab in labels:
            out[lab].append(t.get(lab, math.inf))
    return out


def _run_top_up(
    recipe: Recipe,
    store: ResultsStore,
    plan: Plan,
    cands: list[Any],
    n: int,
    run_fn: RunFn,
    policy: Callable[[], StopPolicy],
    progress: ProbeEvents | None,
    before: Callable[[], None],
) -> int:
    seeds = top_up_seeds(recipe, n)
    jobs = [(c, s) for c in cands for s in seeds if not store.is_finished(run_id(c, s))]
    if not jobs:
        return 0
    before()  # the caller's: a stored end these runs outdate is cleared
    if progress is not None:
        names = ", ".join(dict.fromkeys(c.label for c, _ in jobs))
        progress(
            "plan",
            {"total": len(jobs), "todo": len(jobs), "max_samples": recipe.budget.max_samples,
             "phase": f"seed top-up to {len(seeds)} seeds: {names}"},
        )  # fmt: skip
    ref = [(c, s) for c, s in jobs if c.label == plan.reference]
    rest = [(c, s) for c, s in jobs if c.label != plan.reference]
    done = run_jobs(run_fn, recipe, store, plan.reference_batch, ref, stop_policy(recipe, NO_BAND), progress)
    if rest:
        done += run_jobs(run_fn, recipe, store, plan.reference_batch, rest, policy(), progress)
    return done


def seeding_plan_note(recipe: Recipe, runs: Sequence[tuple[int, float]]) -> str:
    """The plan's line on the seeds a grid probe may add past its planned ones ("" = none): up to
    ``budget.max_extra_seeds`` sequential rounds (measure/sequential.py), and for a recipe with
    async knobs the top-up to ``budget.async_top_up_seeds`` (``async_top_up_max_seeds`` with its
    rounds; its seeds are the rounds' ids, so the two share runs). ``runs``: each candidate's
    (samples, seconds) of one run to its budget; an upper bound, as the plan's totals are."""
    b = recipe.budget
    most = max(b.async_top_up_seeds, b.async_top_up_max_seeds)
    top = most - len(b.seeds) if has_async_knobs(recipe) else 0
    extra = max(b.max_extra_seeds, top, 0)
    if recipe.study.pretrain or not extra or not runs:
        return ""
    samples, secs = extra * sum(n for n, _ in runs), extra * sum(s for _, s in runs)
    wall = f", at most {secs:,.0f} s of run time" if math.isfinite(secs) else ""
    why = [f"up to {b.max_extra_seeds} where a verdict stays inconclusive (budget.max_extra_seeds)"]
    if top > 0:
        why.append(f"contenders up to {most} seeds (budget.async_top_up_seeds, async_top_up_max_seeds)")
    return (
        f"extra seeds (not in the totals above): up to {extra} more per candidate, {'; '.join(why)}: "
        f"at most {extra * len(runs)} run(s) = {samples:,} samples{wall}"
    )


def seeds_by_label(store: ResultsStore) -> dict[str, int]:
    """Finished (not failed) runs per candidate."""
    out: dict[str, int] = defaultdict(int)
    for r in store.runs():
        if r.status not in FAILED_STATUSES:
            out[r.candidate] += 1
    return dict(out)
