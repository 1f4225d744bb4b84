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

Resumable and recorded: each round is written to ``<results>/async_topup.json`` before its runs
start; a rerun first finishes the recorded rounds' runs, then goes on from there, so `recommend`
reports the rounds that were run (``load_top_up``). A record of another margin or seed count is
started afresh (the runs it made are kept and count as seeds).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from batchtune import codec
from batchtune.events import ProbeEvents
from batchtune.measure.execute import RunFn, run_jobs
from batchtune.measure.plan import Plan, run_id
from batchtune.measure.sequential import extra_seed
from batchtune.measure.stop_rule import NO_BAND, StopPolicy, stop_policy
from batchtune.recipe.schema import Recipe
from batchtune.records.files import atomic_write_text
from batchtune.records.store import ResultsStore
from batchtune.records.types import FAILED_STATUSES

if TYPE_CHECKING:
    from batchtune.analysis.decide.async_joint import Knobs
    from batchtune.analysis.decide.async_topup import TopUpRound
    from batchtune.analysis.sample.efficiency import SampleEfficiency

TOP_UP_FILE = "async_topup.json"
TIMES = "the probe's own step times"


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
    of one weight sync over the steps that synced (0 when none did: one process)."""
    from batchtune.analysis.decide.async_joint import Knobs

    first: dict[str, Knobs] = {}
    syncs: dict[str, list[float]] = defaultdict(list)
    for rec in store.runs():
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


@dataclasses.dataclass(frozen=True)
class TopUpRecord:
    margin: float
    top: int
    rounds: tuple[TopUpRound, ...]
    times_source: str = TIMES

    def lines(self) -> list[str]:
        """What `recommend` says: who was topped up, in which round, and why."""
        if not self.rounds:
            return [
                f"seed top-up (budget.async_top_up_seeds = {self.top}, margin {self.margin:.0%}): no "
                "candidate needed more seeds"
            ]
        head = (
            f"seed top-up (budget.async_top_up_seeds = {self.top}): candidates within "
            f"{self.margin:.0%} of the best estimated T ({self.times_source}) got {self.top} seeds, "
            "until no contender lacked seeds"
        )
        return [head] + [f"round {i}: {r.words(self.margin, self.top)}" for i, r in enumerate(self.rounds, 1)]


def load_top_up(store: ResultsStore) -> TopUpRecord | None:
    """The stored record of the probe's top-up rounds (None: none ran)."""
    from batchtune.analysis.decide.async_topup import TopUp, TopUpRound

    path = store.root / TOP_UP_FILE
    if not path.is_file():
        return None
    data = codec.loads(path.read_text(), str(path))
    where = str(path)
    rounds = tuple(
        TopUpRound(
            str(r["best"]),
            codec.as_float(r["best_t"], where),
            tuple(codec.from_dict(TopUp, t, where) for t in r["topped"]),
        )
        for r in data["rounds"]
    )
    return TopUpRecord(
        codec.as_float(data["margin"], where), int(data["top"]), rounds, str(data["times_source"])
    )


def _save(store: ResultsStore, rec: TopUpRecord) -> None:
    data: dict[str, Any] = {
        "margin": rec.margin,
        "top": rec.top,
        "times_source": rec.times_source,
        "rounds": [dataclasses.asdict(r) for r in rec.rounds],
    }
    atomic_write_text(store.root / TOP_UP_FILE, codec.dumps(data, indent=2))


def top_up_seeds(recipe: Recipe) -> list[int]:
    """The seed ids of a candidate topped up to ``budget.async_top_up_seeds`` seeds."""
    planned = list(recipe.budget.seeds)
    return planned + [
        extra_seed(recipe, r) for r in range(1, recipe.budget.async_top_up_seeds - len(planned) + 1)
    ]


def estimates(
    recipe: Recipe, store: ResultsStore, eff: SampleEfficiency
) -> tuple[dict[str, float], dict[str, int]]:
    """(each ranked candidate's best predicted T, its finished seeds) from the store's runs."""
    from batchtune.analysis.decide.async_joint import joint_decision
    from batchtune.analysis.decide.async_topup import best_times
    from batchtune.analysis.decide.recommend import throughput_from_probe
    from batchtune.errors import AnalysisError
    from batchtune.measure.async_sweep import stored_traces

    parallel: dict[str, int] = {}
    for r in store.runs():
        parallel[r.candidate] = max(parallel.get(r.candidate, 0), r.parallel_runs)
    seeds = seeds_by_label(store)
    a = recipe.algorithm
    two = a.mode == "async"
    try:
        thr = throughput_from_probe(eff.candidates, recipe.generation.other_s_per_step, parallel)
        decision = joint_decision(
            eff, thr, run_knobs(store), mini_batches=a.mini_batches, two_process=two,
            sync_every=a.sync_every if two else 1, traces=stored_traces(store),
        )  # fmt: skip
    except AnalysisError:  # nothing to rank yet (no timed on-policy estimate): no contender
        return {}, seeds
    return best_times([(row.label, row.choice.t) for row in decision.rows]), seeds


def add_async_seeds(
    recipe: Recipe,
    store: ResultsStore,
    plan: Plan,
    run_fn: RunFn,
    analyse: Callable[[ResultsStore, Recipe, Plan], SampleEfficiency],
    policy: Callable[[], StopPolicy],
    progress: ProbeEvents | None = None,
) -> int:
    """Run the top-up rounds (module docstring); returns the number of runs executed here.
    ``analyse`` and ``policy`` as in sequential.add_seeds."""
    from batchtune.analysis.decide.async_topup import top_up

    b = recipe.budget
    if not has_async_knobs(recipe) or b.async_top_up_seeds <= len(b.seeds):
        return 0
    by_label = plan.by_label()
    old = load_top_up(store)
    rec = (
        old
        if old is not None and (old.margin, old.top) == (b.async_top_up_margin, b.async_top_up_seeds)
        else TopUpRecord(b.async_top_up_margin, b.async_top_up_seeds, ())
    )
    done = [t.label for r in rec.rounds for t in r.topped]
    ran = 0

    def run(labels: list[str]) -> None:
        nonlocal ran
        ran += _run_top_up(recipe, store, plan, [by_label[lab] for lab in labels if lab in by_label],
                           run_fn, policy, progress)  # fmt: skip

    def record(rnd: TopUpRound) -> None:
        nonlocal rec
        rec = dataclasses.replace(rec, rounds=(*rec.rounds, rnd))
        _save(store, rec)

    run(done)  # a resumed probe: the recorded rounds' runs first
    _save(store, rec)
    top_up(
        lambda: estimates(recipe, store, analyse(store, recipe, plan)),
        run,
        margin=rec.margin,
        top=rec.top,
        done=done,
        on_round=record,
    )
    return ran


def _run_top_up(
    recipe: Recipe,
    store: ResultsStore,
    plan: Plan,
    cands: list[Any],
    run_fn: RunFn,
    policy: Callable[[], StopPolicy],
    progress: ProbeEvents | None,
) -> int:
    seeds = top_up_seeds(recipe)
    jobs = [(c, s) for c in cands for s in seeds if not store.is_finished(run_id(c, s))]
    if not jobs:
        return 0
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


def top_up_lines(store: ResultsStore) -> list[str]:
    """The stored top-up's lines for `recommend` (none when the probe ran no top-up)."""
    rec = load_top_up(store)
    return [] if rec is None else rec.lines()


def seeds_by_label(store: ResultsStore) -> dict[str, int]:
    """Finished (not failed) runs per candidate."""
    out: dict[str, int] = defaultdict(int)
    for r in store.runs():
        if r.status not in FAILED_STATUSES:
            out[r.candidate] += 1
    return dict(out)
