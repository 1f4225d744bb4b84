"""The branches of one checkpoint of a branched probe (measure/branched.py drives the checkpoints).

Controls: one per seed at the reference batch, from the checkpoint, 1.25 windows long; a batch with a
longer window of its own (`branch.min_steps`) extends every control by a segment resumed from the
checkpoint the previous segment saved at its end (a chain: nothing is rerun), and a control that has
not reached the level by then runs on, up to a branch's longest. Branches: the candidates the search
asks for, each at every planned seed, plus confirmation seeds (`branch.confirm_seeds`) for a batch
the search would climb past. Run ids: c<checkpoint>-<label>-s<seed>, and a control's extension adds
-from<samples> (where it starts). The runs of one round go to ``run`` together (run at once where
run.workers allows): every seed's control segment; a round's branches beside the control segments
of seeds it starts (a branch does not depend on its control, only the ratio does); then the
extensions of controls too slow to reach the level. A round's branches stop at a level the controls
already there set, so the controls covering a batch's window run before its first round.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchtune.analysis.branched.ratios import (
    ADOPT,
    MORE,
    BranchCurve,
    LocalCritical,
    adoption,
    control_level,
    local_critical_batch,
    local_ratios,
    reaches,
)
from batchtune.analysis.sample.efficiency import CandidateEfficiency, RunData
from batchtune.backends.spec import Candidate, checkpoint_path
from batchtune.errors import InputError
from batchtune.measure.sequential import extra_seed
from batchtune.measure.stop_rule import StopPolicy
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore
from batchtune.records.types import FAILED_STATUSES, RunRecord

CONTROL_WINDOWS = 1.25  # the control runs past its window so the fit at the window's end is interior


@dataclass(frozen=True)
class Job:
    """One run a branched probe asks for: the trunk, a branch, or a segment of a control."""

    cand: Candidate
    seed: int
    rid: str
    budget: int  # the cumulative samples it may run to
    policy: StopPolicy
    extra: dict[str, Any]  # RunSpec's resume_from / save_at_samples / checkpoint_dir


RunFn = Callable[[list[Job]], None]  # runs each job once: at once, where the recipe allows (run.workers)
PolicyFn = Callable[[float, int, int, bool], StopPolicy]  # (target, max samples, origin, stop at target)


def branch_id(ckpt: int, cand: Candidate, seed: int) -> str:
    return f"c{ckpt}-{cand.label}-s{seed}"


def control_id(ckpt: int, ref: Candidate, seed: int, start: int) -> str:
    """A segment of the control of one seed: the first starts at the checkpoint; an extension
    carries where it starts (resumed from the segment before)."""
    rid = branch_id(ckpt, ref, seed)
    return rid if start == ckpt else f"{rid}-from{start}"


def checkpoint_of(rid: str) -> int | None:
    """The checkpoint a branch or control segment grew from, from its id c<checkpoint>-...; None
    for the trunk."""
    return int(rid[1:].split("-", 1)[0]) if rid.startswith("c") else None


def origin(rid: str) -> int:
    """Where a run started (0 for the trunk), from its id: c<checkpoint>-... for a branch, and
    ...-from<samples> for a control's extension."""
    if "-from" in rid:
        return int(rid.rsplit("-from", 1)[1])
    return checkpoint_of(rid) or 0


def run_curve(store: ResultsStore, rec: RunRecord, metric: str, start: int, batch: float) -> BranchCurve:
    """One stored run as a curve on samples counted from ``start`` (its checkpoint)."""
    s, v = RunData(rec, tuple(store.steps(rec.run_id))).curve(metric)
    return BranchCurve(
        batch=float(batch),
        seed=rec.seed,
        samples=s - start,
        values=v,
        failed=rec.status in FAILED_STATUSES,
        consumed=float(max(rec.samples - start, 0)),
    )


def stored_curve(store: ResultsStore, rid: str, metric: str, start: int, batch: float) -> BranchCurve:
    rec = store.run(rid)
    if rec is None:
        raise InputError(f"{store.root}: the branch {rid} did not finish; rerun the probe to redo it")
    return run_curve(store, rec, metric, start, batch)


def control_curve(
    store: ResultsStore, ckpt: int, ref: Candidate, seed: int, metric: str, upto: float
) -> BranchCurve:
    """The control of one seed: the curves of its segments that start before ``upto`` (where the
    probe has extended it to so far: a rerun replays the same decisions from the same data, even
    when the store already holds later segments), joined; samples from the checkpoint."""
    prefix = branch_id(ckpt, ref, seed)
    recs = sorted(
        (
            r
            for r in store.runs(prefix)  # also c..-s1 for s10, hence the test
            if (r.run_id == prefix or r.run_id.startswith(prefix + "-from")) and origin(r.run_id) < upto
        ),
        key=lambda r: origin(r.run_id),
    )
    parts = [run_curve(store, r, metric, ckpt, ref.batch_responses) for r in recs]
    return BranchCurve(
        batch=float(ref.batch_responses),
        seed=seed,
        samples=np.concatenate([p.samples for p in parts]),
        values=np.concatenate([p.values for p in parts]),
        failed=any(p.failed for p in parts),
        consumed=max(p.consumed for p in parts),
    )


def efficiency_of(cand: Candidate, mine: list[RunData]) -> CandidateEfficiency:
    """A candidate's timings and costs from its runs (its estimate comes from the summary)."""
    steps = [s for r in mine for s in r.steps]

    def median(key: str) -> float:
        return float(np.median([getattr(s, key) for s in steps])) if steps else 0.0

    return CandidateEfficiency(
        label=cand.label,
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
        gen_s_per_step=median("gen_s"),
        train_s_per_step=median("train_s"),
        other_s_per_step=median("other_s"),
        samples_consumed=int(sum(r.record.samples - origin(r.record.run_id) for r in mine)),
        wall_s=sum(r.record.wall_s for r in mine),
        critic_lr=cand.critic_lr,
    )


class AtCheckpoint:
    """The branches of one checkpoint: the controls (a chain of segments per seed), the branches
    the search asks for, and the local critical batch they give."""

    def __init__(
        self,
        recipe: Recipe,
        store: ResultsStore,
        run: RunFn,
        policy: PolicyFn,
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
        # every branch starts from the trunk's checkpoint; at 0, from initialisation (a fresh run)
        self.resume = checkpoint_path(ckpt_dir, c) if c > 0 else None
        self.ends: dict[int, int] = {}  # seed -> where its control's last segment ends
        self.controls: dict[int, BranchCurve] = {}  # seed -> its control's curve so far
        self.branches: list[BranchCurve] = []
        self.control_len = 0  # the window every control covers
        self.windows: dict[float, float] = {}  # batch -> its window, for the batches branched
        self.levels: dict[int, float] = {}  # batch -> the level its branches stopped at
        self.cover(self.w)
        t = recipe.target
        # raises if no progress
        control_level(c, start, self.curves, self.b0, self.w, t.higher_is_better, unit=recipe.sample_unit)

    @property
    def curves(self) -> list[BranchCurve]:
        return [*self.controls.values(), *self.branches]

    def window(self, batch: int) -> int:
        """W, or min_steps of the batch's own steps when that is longer."""
        return self.w if batch == self.b0 else max(self.w, self.recipe.branch.min_steps * batch)

    def _end(self, window: float) -> int:
        """Cumulative samples ``window`` past the checkpoint, rounded up to whole control steps."""
        return self.c + math.ceil(window / self.b0) * self.b0

    def _extension(self, s: int, end: int) -> Job | None:
        """The segment that extends seed ``s``'s control to ``end`` from where it ends (the
        checkpoint, or the end of its previous segment, resumed from the checkpoint saved there)."""
        c, ref, start_at = self.c, self.ref, self.ends.get(s, self.c)
        if end <= start_at:
            return None
        cdir = self.ckpt_dir / f"c{c}-control-s{s}"
        resume = self.resume if start_at == c else checkpoint_path(cdir, start_at)
        rid = control_id(c, ref, s, start_at)
        if start_at == c:
            self.check_start([rid])
        if (
            resume is not None
            and not self.store.is_finished(rid)
            and not any(resume.parent.glob(resume.name + "*"))
        ):
            raise InputError(
                f"{self.store.root}: the control {control_id(c, ref, s, c)} has no checkpoint at its "
                "end to extend (results of an older batchtune?); probe into a fresh results_dir"
            )
        seg = {"resume_from": resume, "save_at_samples": (end,), "checkpoint_dir": cdir}
        return Job(ref, s, rid, end, self.policy(self.recipe.target.value, end, c, False), seg)

    def check_start(self, rids: list[str]) -> None:
        """Runs still to do from the trunk's checkpoint (``rids``) find it: without it each would be
        sealed as failed, which reads as the batch failing (a different answer)."""
        r = self.resume
        if r is None or any(
            p.name == r.name or p.name.startswith(r.name + ".") for p in r.parent.glob("ckpt-*")
        ):
            return
        todo = [rid for rid in rids if not self.store.is_finished(rid)]
        if todo:
            raise InputError(
                f"{self.store.root}: the trunk's checkpoint {r} is missing, and the run {todo[0]} is "
                "to start from it; probe into a fresh results_dir"
            )

    def _extend(self, ends: dict[int, int], also: list[Job] | None = None) -> None:
        """Extend each seed's control to its end in ``ends``: one segment per seed, run together
        (and with the runs ``also``, which do not depend on them)."""
        jobs = {s: job for s, end in ends.items() if (job := self._extension(s, end)) is not None}
        self.run([*jobs.values(), *(also or [])])
        for s in jobs:
            self.ends[s] = ends[s]
            self.controls[s] = control_curve(
                self.store, self.c, self.ref, s, self.recipe.target.metric, ends[s]
            )

    def cover(self, need: int) -> None:
        """Every planned seed's control covering a window of ``need`` samples (and a confirmation
        seed's, once it has one)."""
        if need <= self.control_len:
            return
        end = self._end(CONTROL_WINDOWS * need)
        self._extend({s: end for s in dict.fromkeys([*self.seeds, *self.ends])})
        self.control_len = need

    def controls_for(self, seeds: list[int], level: float, longest: float, branches: list[Job]) -> None:
        """These seeds' controls (a confirmation seed's is started here) as far as the others run,
        run together with ``branches`` (a branch does not depend on its control: only the ratios
        do), and further, up to ``longest`` samples past the checkpoint (as far as a branch may
        run), while one has not reached ``level``: a seed whose control is slow to reach the median
        level would otherwise have no R_c(B0, s) and drop out of the ratios."""
        self._extend({s: self._end(CONTROL_WINDOWS * self.control_len) for s in seeds}, branches)
        hib = self.recipe.target.higher_is_better
        slow = [
            s
            for s in seeds
            if not self.controls[s].failed
            and not reaches(self.controls[s], self.start, level, higher_is_better=hib)
        ]
        self._extend({s: self._end(longest) for s in slow})

    def within(self, main: list[Candidate], i: int) -> bool:
        """Branch candidate main[i] over its window at every planned seed, then at one more seed at
        a time (each with its own control, so it stays paired; the level stays the planned seeds')
        while the sequential test of analysis/branched/ratios.adoption says MORE; True when it ADOPTs the
        batch (at least branch.confirm_seeds seeds whose upper confidence bound is within 1+tol).
        A seed whose control never reaches the level, even run as long as a branch may, rejects
        the batch (the conservative side)."""
        cand, t, c, br = main[i], self.recipe.target, self.c, self.recipe.branch
        wb = self.window(cand.batch_responses)
        self.windows[cand.batch_responses] = wb
        self.cover(wb)
        unit = self.recipe.sample_unit
        lv = control_level(c, self.start, self.curves, self.b0, wb, t.higher_is_better, self.seeds, unit=unit)
        self.levels[cand.batch_responses] = lv
        budget = c + math.ceil(self.recipe.branch.max_window_factor * wb)
        mine: list[int] = []
        todo = list(self.seeds)
        ok = False
        while todo:  # a round's seeds run together: their branches, and their controls beside them
            extra = {"resume_from": self.resume}
            jobs = [
                Job(cand, s, branch_id(c, cand, s), budget, self.policy(lv, budget, c, True), extra)
                for s in todo
            ]
            self.check_start([j.rid for j in jobs])
            self.controls_for(todo, lv, self.recipe.branch.max_window_factor * wb, jobs)
            for s in todo:
                self.branches.append(
                    stored_curve(self.store, branch_id(c, cand, s), t.metric, c, cand.batch_responses)
                )
                mine.append(s)
            got = local_ratios(self.start, self.curves, self.b0, lv, t.higher_is_better, cand.batch_responses)
            # a seed whose control never reached the level has no ratio: NaN (unpaired) rejects
            ratios = [*got, *[math.nan] * (len(mine) - len(got))]
            verdict = adoption(
                ratios,
                tol=t.tolerance,
                confidence=t.confidence,
                min_seeds=br.confirm_seeds,
                max_seeds=max(br.max_seeds, br.confirm_seeds, len(self.seeds)),
                min_reject_seeds=br.confirm_seeds if br.confirm_rejections else 1,
            )
            ok = verdict == ADOPT
            todo = [extra_seed(self.recipe, len(mine) - len(self.seeds) + 1)] if verdict == MORE else []
        return ok

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
            unit=self.recipe.sample_unit,
        )


def search_batches(n: int, within: Callable[[int], bool], search: str, prev_lo: int) -> tuple[list[int], int]:
    """Which of the main batches 1..n-1 one checkpoint tests, and the last within tolerance.

    ``search = "all"``: every one. Else a bisection between main[0] (within tolerance: the reference
    is) and main[n] (unknown), starting from the previous checkpoint's answer ``prev_lo``: one step up
    if it holds, else one down."""
    tested: list[int] = []
    if search == "all":
        for i in range(1, n):
            tested.append(i)
            within(i)
        return tested, prev_lo
    lo, hi = 0, n
    guess = prev_lo if prev_lo else n // 2
    while hi - lo > 1:
        mid = guess if lo < guess < hi else (lo + hi) // 2
        tested.append(mid)
        ok = within(mid)
        guess = (mid + 1 if ok else mid - 1) if mid == prev_lo else 0
        lo, hi = (mid, hi) if ok else (lo, mid)
    return tested, lo
