"""Branched probes (`probe.mode = "branched"`): one trunk, short branches from its checkpoints.

Merrill et al. 2025 ("Critical Batch Size Revisited", arXiv 2505.23971): a run at the reference
batch B0 (the trunk, first seed of budget.seeds) saves checkpoints at `branch.checkpoints` x
`branch.trunk_samples`; from each checkpoint every main candidate B runs a branch at its scaled LR,
once per seed. The reference's own branch (the control) runs 1.25 windows; the local target is the
median of the controls' fitted metric one window past the checkpoint (a control that has not reached
it runs on, up to a branch's longest). A batch B whose window would be fewer
than `branch.min_steps` of its own steps gets the window W_B = min_steps * B instead, and every
control is extended to cover it by a segment resumed from its own end (a chain; nothing is rerun).
The other branches stop once they reach the level (confirmed 20% past it) or after
`branch.max_window_factor` windows (censored); `branch.search = "bisect"` branches only the batches a
binary search for the last one within 1+tol needs, and a batch it would climb past on fewer than
`branch.confirm_seeds` seeds is branched at the next seed too (with that seed's own control).
analysis/branched.py turns the curves into the local critical batch per checkpoint.

Every trunk and branch is an ordinary run of the results store under `<results>/branched/`: sealed
by its run.json, never redone; a run killed at any point (even kill -9) is redone from its start on
rerun, and a trunk redone rewrites the same checkpoints (the backends are deterministic per seed).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from batchtune import backends
from batchtune.analysis.branched import (
    BranchCurve,
    LocalCritical,
    control_level,
    local_critical_batch,
    local_ratios,
    reaches,
)
from batchtune.analysis.branched_summary import BranchedSummary, summarise_branched
from batchtune.analysis.efficiency import CandidateEfficiency, RunData, SampleEfficiency
from batchtune.backends.spec import Candidate, checkpoint_path
from batchtune.errors import AnalysisError, InputError
from batchtune.events import ProbeEvents
from batchtune.measure.plan import Plan, plan_candidates
from batchtune.measure.probe import StopPolicy, check_manifest, execute_run
from batchtune.measure.sequential import extra_seed
from batchtune.recipe.schema import Recipe
from batchtune.records import FAILED_STATUSES, ResultsStore

CONTROL_WINDOWS = 1.25  # the control runs past its window so the fit at the window's end is interior


@dataclass(frozen=True)
class BranchedRuns:
    """What the branched probe measured, as plain data for analysis/branched_summary.py."""

    plan: Plan
    trunk: RunData
    checkpoints: tuple[int, ...]  # cumulative samples of each checkpoint
    locals: tuple[LocalCritical, ...]
    branches: tuple[RunData, ...]
    skipped: dict[int, tuple[str, ...]]  # checkpoint -> labels the search did not branch
    runs_done: int
    runs_skipped: int
    wall_s: float


def branched_store(results_dir: str | Path) -> ResultsStore:
    return ResultsStore(Path(results_dir) / "branched")


def checkpoint_positions(recipe: Recipe, reference_batch: int) -> tuple[int, ...]:
    """Checkpoints in cumulative samples: fractions of the trunk rounded to whole trunk steps."""
    b = recipe.branch
    out = {max(1, round(f * b.trunk_samples / reference_batch)) * reference_batch for f in b.checkpoints}
    return tuple(sorted(out))


def _trunk_id(ref: Candidate, seed: int) -> str:
    return f"trunk-{ref.label}-s{seed}"


def _branch_id(ckpt: int, cand: Candidate, seed: int) -> str:
    return f"c{ckpt}-{cand.label}-s{seed}"


def _control_id(ckpt: int, ref: Candidate, seed: int, start: int) -> str:
    """A segment of the control of one seed: the first starts at the checkpoint; an extension
    carries where it starts (resumed from the segment before)."""
    rid = _branch_id(ckpt, ref, seed)
    return rid if start == ckpt else f"{rid}-from{start}"


def _control_curve(
    store: ResultsStore, ckpt: int, ref: Candidate, seed: int, metric: str, batch: float, upto: int
) -> BranchCurve:
    """The control of one seed: the curves of its segments that start before ``upto`` (where the
    probe has extended it to so far: a rerun replays the same decisions from the same data, even
    when the store already holds later segments), joined; samples from the checkpoint."""
    prefix = _branch_id(ckpt, ref, seed)
    ids = sorted(
        (
            r.run_id
            for r in store.runs()
            if (r.run_id == prefix or r.run_id.startswith(prefix + "-from")) and _origin(r.run_id) < upto
        ),
        key=_origin,
    )
    parts = [_curve(store, rid, metric, ckpt, batch) for rid in ids]
    return BranchCurve(
        batch=float(batch),
        seed=seed,
        samples=np.concatenate([p.samples for p in parts]),
        values=np.concatenate([p.values for p in parts]),
        failed=any(p.failed for p in parts),
        consumed=max(p.consumed for p in parts),
    )


def _with_budget(recipe: Recipe, max_samples: int) -> Recipe:
    return dataclasses.replace(recipe, budget=dataclasses.replace(recipe.budget, max_samples=max_samples))


def _curve(store: ResultsStore, rid: str, metric: str, origin: int, batch: float) -> BranchCurve:
    rec = next(r for r in store.runs() if r.run_id == rid)
    data = RunData(rec, tuple(store.steps(rid)))
    s, v = data.curve(metric)
    return BranchCurve(
        batch=float(batch),
        seed=rec.seed,
        samples=s - origin,
        values=v,
        failed=rec.status in FAILED_STATUSES,
        consumed=float(max(rec.samples - origin, 0)),
    )


def run_branched(
    recipe: Recipe, progress: ProbeEvents | None = None, *, read_only: bool = False
) -> BranchedRuns:
    """Run (or resume) the trunk and the branches of ``recipe``; returns the measured curves.

    ``read_only``: train nothing, read what is there (InputError if a needed run is missing)."""
    t0 = time.perf_counter()
    problem = backends.checkpoint_problem(recipe)
    if problem is not None:
        raise InputError(f"{problem}, so probe.mode = 'branched' cannot use it; use probe.mode = 'grid'")
    root = ResultsStore(recipe.run.results_dir)
    check_manifest(root, recipe)
    store = branched_store(recipe.run.results_dir)
    plan = plan_candidates(recipe)
    by_label = plan.by_label()
    main = [by_label[lab] for lab in plan.main]
    ref = by_label[plan.reference]
    b0 = ref.batch_responses
    seeds = list(recipe.budget.seeds)
    t = recipe.target
    ckpts = checkpoint_positions(recipe, b0)
    ckpt_dir = store.root / "checkpoints"
    done = skipped_runs = 0

    def run(cand: Candidate, seed: int, rid: str, budget: int, policy: StopPolicy, extra: dict) -> None:
        nonlocal done, skipped_runs
        if store.is_finished(rid):
            skipped_runs += 1
            return
        if read_only:
            raise InputError(f"{store.root} lacks the run {rid}: run `batchtune probe` to finish it")
        rec = execute_run(
            _with_budget(recipe, budget),
            str(store.root),
            cand,
            seed,
            recipe.optimizer.lr,
            plan.reference_batch,
            policy,
            events=progress,
            rid=rid,
            spec_extra=extra,
        )
        done += rec is not None

    def policy(target: float, max_samples: int, origin: int, stop: bool) -> StopPolicy:
        return StopPolicy(
            t.metric, target, t.higher_is_better, t.ema_alpha, max_samples, stop, math.inf, origin
        )

    trunk_id = _trunk_id(ref, seeds[0])
    if progress is not None:
        progress("plan", {"total": 0, "todo": 0, "max_samples": ckpts[-1]})
    run(
        ref,
        seeds[0],
        trunk_id,
        ckpts[-1],
        policy(t.value, ckpts[-1], 0, False),
        {"save_at_samples": ckpts, "checkpoint_dir": ckpt_dir},
    )
    trunk_rec = next((r for r in store.runs() if r.run_id == trunk_id), None)
    if trunk_rec is None or trunk_rec.status in FAILED_STATUSES or trunk_rec.samples < ckpts[-1]:
        why = trunk_rec.reason if trunk_rec else "it did not finish"
        raise AnalysisError(f"the trunk {trunk_id} did not reach its last checkpoint: {why}")
    trunk = RunData(trunk_rec, tuple(store.steps(trunk_id)))
    ts, tv = trunk.curve(t.metric)

    locals_: list[LocalCritical] = []
    skipped: dict[int, tuple[str, ...]] = {}
    prev_lo = 0  # index in main of the last batch within tolerance at the previous checkpoint
    for c in ckpts:
        at = _AtCheckpoint(recipe, store, run, policy, ref, c, float(np.interp(c, ts, tv)), ckpt_dir)
        within = partial(at.within, main)
        tested: list[int] = []
        if recipe.branch.search == "all":
            for i in range(1, len(main)):
                tested.append(i)
                within(i)
        else:  # main[lo] is within tolerance (the reference is), main[hi] is not (hi = len: unknown)
            lo, hi = 0, len(main)
            guess = prev_lo if prev_lo else len(main) // 2
            while hi - lo > 1:
                mid = guess if lo < guess < hi else (lo + hi) // 2
                guess = mid + 1 if mid == prev_lo else 0
                tested.append(mid)
                lo, hi = (mid, hi) if within(mid) else (lo, mid)
            prev_lo = lo
        skipped[c] = tuple(main[i].label for i in range(1, len(main)) if i not in tested)
        locals_.append(at.local_critical())
    branch_ids = {r.run_id for r in store.runs() if r.run_id != trunk_id}
    branches = tuple(RunData(r, tuple(store.steps(r.run_id))) for r in store.runs() if r.run_id in branch_ids)
    return BranchedRuns(
        plan=plan,
        trunk=trunk,
        checkpoints=ckpts,
        locals=tuple(locals_),
        branches=branches,
        skipped=skipped,
        runs_done=done,
        runs_skipped=skipped_runs,
        wall_s=time.perf_counter() - t0,
    )


RunFn = Callable[[Candidate, int, str, int, StopPolicy, dict], None]


class _AtCheckpoint:
    """The branches of one checkpoint: the controls (a chain of segments per seed), the branches
    the search asks for, and the local critical batch they give."""

    def __init__(
        self,
        recipe: Recipe,
        store: ResultsStore,
        run: RunFn,
        policy: Callable[[float, int, int, bool], StopPolicy],
        ref: Candidate,
        c: int,
        start: float,
        ckpt_dir: Path,
    ) -> None:
        self.recipe, self.store, self.run, self.policy = recipe, store, run, policy
        self.ref, self.c, self.start, self.ckpt_dir = ref, c, start, ckpt_dir
        self.b0 = ref.batch_responses
        self.w = recipe.branch.window_samples
        self.seeds = list(recipe.budget.seeds)
        self.ends = {s: c for s in self.seeds}  # seed -> where its control's last segment ends
        self.control_len = 0  # the window the controls now cover
        self.windows: dict[float, float] = {}  # batch -> its window, for the batches branched
        self.curves: list[BranchCurve] = []
        self.controls(self.w)
        t = recipe.target
        control_level(c, start, self.curves, self.b0, self.w, t.higher_is_better)  # raises if no progress

    def window(self, batch: int) -> int:
        """W, or min_steps of the batch's own steps when that is longer."""
        return self.w if batch == self.b0 else max(self.w, self.recipe.branch.min_steps * batch)

    def _segment(self, s: int, end: int) -> None:
        """Extend seed ``s``'s control to ``end`` by one segment from where it ends (the checkpoint,
        or the end of its previous segment, resumed from the checkpoint saved there)."""
        c, ref, start_at = self.c, self.ref, self.ends.get(s, self.c)
        if end <= start_at:
            return
        cdir = self.ckpt_dir / f"c{c}-control-s{s}"
        resume = checkpoint_path(self.ckpt_dir, c) if start_at == c else checkpoint_path(cdir, start_at)
        rid = _control_id(c, ref, s, start_at)
        if not self.store.is_finished(rid) and not any(resume.parent.glob(resume.name + "*")):
            raise InputError(
                f"{self.store.root}: the control {_control_id(c, ref, s, c)} has no checkpoint at its "
                "end to extend (results of an older batchtune?); probe into a fresh results_dir"
            )
        seg = {"resume_from": resume, "save_at_samples": (end,), "checkpoint_dir": cdir}
        self.run(ref, s, rid, end, self.policy(self.recipe.target.value, end, c, False), seg)
        self.ends[s] = end

    def _refresh_controls(self) -> None:
        metric = self.recipe.target.metric
        self.curves[:] = [cv for cv in self.curves if cv.batch != self.b0]
        self.curves.extend(
            _control_curve(self.store, self.c, self.ref, s, metric, self.b0, end)
            for s, end in self.ends.items()
        )

    def controls(self, need: int) -> None:
        """Controls (one per seed) covering a window of ``need`` samples. The first segment covers
        W; a batch with a longer window of its own extends every control by a segment resumed from
        the previous one's end (a chain, as schedule runs are: nothing is rerun)."""
        if need <= self.control_len:
            return
        end = self._end(CONTROL_WINDOWS * need)
        for s in list(self.ends):
            self._segment(s, end)
        self._refresh_controls()
        self.control_len = need

    def _end(self, window: float) -> int:
        """Cumulative samples ``window`` past the checkpoint, rounded up to whole control steps."""
        return self.c + math.ceil(window / self.b0) * self.b0

    def control_for(self, s: int, level: float, longest: float) -> None:
        """Seed ``s``'s control (a confirmation seed's is started here) as far as the others run,
        and further, up to ``longest`` samples past the checkpoint (as far as a branch may run),
        while it has not reached ``level``: a seed whose control is slow to reach the median level
        would otherwise have no R_c(B0, s) and drop out of the ratios."""
        self._segment(s, self._end(CONTROL_WINDOWS * self.control_len))
        t = self.recipe.target
        self._refresh_controls()
        ctrl = next(cv for cv in self.curves if cv.batch == self.b0 and cv.seed == s)
        if not ctrl.failed and not reaches(ctrl, self.start, level, higher_is_better=t.higher_is_better):
            self._segment(s, self._end(longest))
            self._refresh_controls()

    def within(self, main: list[Candidate], i: int) -> bool:
        """Branch candidate main[i] over its window at every seed; True when its paired ratio point
        <= 1+tol. One that passes on fewer than branch.confirm_seeds seeds is branched at the next
        seed too (with that seed's own control, so it stays paired; the level stays the planned
        seeds') until it falls behind or has that many. A seed whose control never reaches the
        level, even run as long as a branch may, leaves the batch unconfirmed (the conservative
        side)."""
        cand, t, c = main[i], self.recipe.target, self.c
        wb = self.window(cand.batch_responses)
        self.windows[cand.batch_responses] = wb
        self.controls(wb)
        lv = control_level(c, self.start, self.curves, self.b0, wb, t.higher_is_better, self.seeds)
        budget = c + math.ceil(self.recipe.branch.max_window_factor * wb)
        mine: list[int] = []
        todo = list(self.seeds)
        ok = False
        while todo:
            for s in todo:
                self.control_for(s, lv, self.recipe.branch.max_window_factor * wb)
                rid = _branch_id(c, cand, s)
                self.run(cand, s, rid, budget, self.policy(lv, budget, c, True), {"resume_from": self.resume})
                self.curves.append(_curve(self.store, rid, t.metric, c, cand.batch_responses))
                mine.append(s)
            got = local_ratios(self.start, self.curves, self.b0, lv, t.higher_is_better, cand.batch_responses)
            ratios = [r for r in got if r > 0]
            ok = len(ratios) == len(mine) and math.exp(float(np.mean(np.log(ratios)))) <= 1 + t.tolerance
            more = len(mine) < self.recipe.branch.confirm_seeds
            todo = [extra_seed(self.recipe, len(mine) - len(self.seeds) + 1)] if ok and more else []
        return ok

    @property
    def resume(self) -> Path:
        return checkpoint_path(self.ckpt_dir, self.c)

    def local_critical(self) -> LocalCritical:
        t = self.recipe.target
        return local_critical_batch(
            self.c,
            self.start,
            self.curves,
            reference_batch=self.b0,
            window_samples=self.w,
            higher_is_better=t.higher_is_better,
            tol=t.tolerance,
            confidence=t.confidence,
            windows=self.windows,
            level_seeds=self.seeds,
        )


@dataclass(frozen=True)
class BranchedProbeResult:
    """What `probe` returns in branched mode: ProbeResult's fields plus the branched summary."""

    plan: Plan
    efficiency: SampleEfficiency
    summary: BranchedSummary
    runs: BranchedRuns
    runs_done: int
    runs_skipped: int
    wall_s: float
    plot_path: Path | None = None


def analyse_branched(recipe: Recipe, runs: BranchedRuns) -> BranchedSummary:
    """Candidates with their measured timings and costs (the trunk counted to the reference), then
    analysis/branched_summary.py."""
    t = recipe.target
    by_label = runs.plan.by_label()
    cands = []
    for lab in runs.plan.main:
        cand = by_label[lab]
        mine = [r for r in runs.branches if r.record.candidate == lab]
        if lab == runs.plan.reference:
            mine.append(runs.trunk)
        steps = [s for r in mine for s in r.steps]
        cost = sum(r.record.samples - _origin(r.record.run_id) for r in mine)
        cands.append(
            CandidateEfficiency(
                label=lab,
                prompts=cand.prompts,
                group_size=cand.group_size,
                lr=cand.lr,
                lr_rule=cand.lr_rule,
                family="main",
                estimate=None,
                verdict=None,
                n_runs=len(mine),
                failures=tuple(
                    f"{r.record.run_id}: {r.record.status} ({r.record.reason})"
                    for r in mine
                    if r.record.status in FAILED_STATUSES
                ),
                gen_s_per_step=float(np.median([s.gen_s for s in steps])) if steps else 0.0,
                train_s_per_step=float(np.median([s.train_s for s in steps])) if steps else 0.0,
                other_s_per_step=float(np.median([s.other_s for s in steps])) if steps else 0.0,
                samples_consumed=int(cost),
                wall_s=sum(r.record.wall_s for r in mine),
                critic_lr=cand.critic_lr,
            )
        )
    ts, tv = runs.trunk.curve(t.metric)
    return summarise_branched(
        ts,
        tv,
        runs.locals,
        cands,
        reference=runs.plan.reference,
        metric=t.metric,
        target=t.value,
        higher_is_better=t.higher_is_better,
        tolerance=t.tolerance,
        confidence=t.confidence,
    )


def _origin(rid: str) -> int:
    """Where a run started (0 for the trunk), from its id: c<checkpoint>-... for a branch, and
    ...-from<samples> for a control's extension."""
    if "-from" in rid:
        return int(rid.rsplit("-from", 1)[1])
    return int(rid[1:].split("-", 1)[0]) if rid.startswith("c") else 0


def run_branched_probe(
    recipe: Recipe, progress: ProbeEvents | None = None, *, read_only: bool = False
) -> BranchedProbeResult:
    """Run (or resume) a branched probe and read it (`batchtune probe` with probe.mode = branched)."""
    runs = run_branched(recipe, progress, read_only=read_only)
    summary = analyse_branched(recipe, runs)
    return BranchedProbeResult(
        plan=runs.plan,
        efficiency=summary.efficiency,
        summary=summary,
        runs=runs,
        runs_done=runs.runs_done,
        runs_skipped=runs.runs_skipped,
        wall_s=runs.wall_s,
    )
