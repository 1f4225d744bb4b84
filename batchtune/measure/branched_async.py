"""Off-policy branches of a branched probe (issue 30 item 3): staleness k and updates per batch u
branched from the trunk's checkpoint, at the candidate batch, against its k = 0 branch.

Only a recipe with off-policy knobs (measure/async_topup.has_async_knobs) and off-policy candidates
in its plan (probe.staleness / probe.updates_per_batch, or the auto sweep's kept cells) branches
them. Where: the last checkpoint the probe could read (the one nearest the target), at the candidate
batch, the largest main batch the search adopted there (the reference if none). Each of that batch's
off-policy candidates (label ``{base}-k{k}u{u}``) runs one branch per seed the on-policy batch was
branched at, from the same checkpoint (the same weights and optimiser state: a run at k >= 1 starts
with its stale history at those weights), at the same LR and budget, and stops at the same level as
the on-policy branches of that batch. The comparator is the k = 0 branch of the same seed (the
control, for the reference batch): per seed, R_c(B, k, u) / R_c(B, 0) to that level, paired on the
same samples axis. analysis/branched/offpolicy.py turns these into R(B, k, u) estimates that the
async ranking (analysis/decide/async_joint.py) reads as it reads a grid sweep's.

`branch.offpolicy_read = "target"` reads further: a k = 0 branch of the base batch (label
``{base}-k0``) runs per seed from the checkpoint to the target itself (budget.max_samples at most),
then each off-policy branch to the target too, capped at TARGET_CAP x the longest k = 0 run (past
it, censored: ranked as not reaching the target); the ratio is read at the target. A delayed
gradient near its stability edge keeps up over one window and falls behind (or diverges) later: on
the NQM (benchmarks/branched_async.py) the window read picked a cell that never reaches the target
in 2 of 12 probes, this read in none, at ~2.2x the off-policy samples.

Run ids: c<checkpoint>-<label>-s<seed>, as any branch: sealed in <results>/branched/, reused on
rerun, never redone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from batchtune.analysis.branched.ratios import BranchCurve, crossing
from batchtune.backends.spec import Candidate
from batchtune.measure.branch_checkpoint import AtCheckpoint, Job, branch_id, stored_curve
from batchtune.measure.plan import Plan
from batchtune.recipe.schema import Recipe


@dataclass(frozen=True)
class OffPolicyBranches:
    """What the off-policy branches of one checkpoint measured."""

    checkpoint: int  # cumulative samples of the checkpoint they branched from
    base: str  # the on-policy main candidate they are compared with (k = 0, same batch)
    level: float  # the level every branch (and the comparator) is read at
    # off-policy label -> seed -> (R_c(B, k, u) / R_c(B, 0), censored: the branch never reached it)
    ratios: dict[str, dict[int, tuple[float, bool]]]
    samples: int  # what the off-policy branches spent


def offpolicy_plan(recipe: Recipe, plan: Plan, on_wait: Callable[[], None] = lambda: None) -> Plan:
    """``plan`` as the branched probe runs it: with the auto sweep, only the cells it kept
    (measure/async_sweep.py, stored in the results directory; ``on_wait()`` where another process
    is timing it)."""
    from batchtune.measure.async_topup import has_async_knobs

    if plan.offpolicy and has_async_knobs(recipe) and recipe.probe.async_sweep == "auto":
        from batchtune.measure.async_sweep import pruned_plan

        return pruned_plan(recipe, plan, on_wait)
    return plan


def judged(at: AtCheckpoint, main: list[Candidate], verdicts: dict[int, bool], i: int) -> bool:
    """``at.within(main, i)``, its verdict kept in ``verdicts``."""
    verdicts[i] = ok = at.within(main, i)
    return ok


def offpolicy_of(plan: Plan, base: str) -> list[str]:
    """The off-policy labels of main candidate ``base`` in ``plan``."""
    return [lab for lab in plan.offpolicy if lab.startswith(f"{base}-k")]


def candidate_index(verdicts: dict[int, bool]) -> int:
    """The largest main index the search adopted at a checkpoint (0, the reference, if none)."""
    return max([0, *(i for i, ok in verdicts.items() if ok)])


def _ratio(off: BranchCurve, fresh: BranchCurve, start: float, level: float, hib: bool) -> tuple[float, bool]:
    r0 = crossing(fresh, start, level, hib).samples_to_target
    r = crossing(off, start, level, hib).samples_to_target
    if r0 is None or r0 <= 0:  # the k = 0 branch itself never reached it: no pairing possible
        return math.nan, True
    if r is None:  # censored where the branch stopped
        return float(max(off.consumed, 1.0)) / r0, True
    return r / r0, False


def run_offpolicy(at: AtCheckpoint, plan: Plan, main: list[Candidate], i: int) -> OffPolicyBranches | None:
    """Branch main[i]'s off-policy candidates at checkpoint ``at`` (module docstring); None when it
    has none."""
    base = main[i]
    by = plan.by_label()
    offs = [by[lab] for lab in offpolicy_of(plan, base.label)]
    if not offs:
        return None
    recipe, c, b = at.recipe, at.c, base.batch_responses
    t = recipe.target
    wb = at.window(b)
    if i == 0:  # the reference: its comparator is each seed's control
        at.cover(wb)
        level = at.levels.get(b) or _control_level(at, wb)
        fresh = dict(at.controls)
    else:
        level = at.levels[b]
        fresh = {cv.seed: cv for cv in at.branches if cv.batch == b}
    budget = c + math.ceil(recipe.branch.max_window_factor * wb)
    seeds = sorted(fresh)
    jobs = [
        Job(o, s, branch_id(c, o, s), budget, at.policy(level, budget, c, True), {"resume_from": at.resume})
        for o in offs
        for s in seeds
    ]
    spent = 0
    if recipe.branch.offpolicy_read == "target":
        fresh, spent = _comparators_to_target(at, base, seeds)
        level = t.value
        budget = _target_cap(at, fresh)
        jobs = [dataclasses.replace(j, budget=budget, policy=at.policy(level, budget, c, True)) for j in jobs]
    at.check_start([j.rid for j in jobs])
    at.run(jobs)
    ratios: dict[str, dict[int, tuple[float, bool]]] = {}
    for o in offs:
        mine: dict[int, tuple[float, bool]] = {}
        for s in seeds:
            cv = stored_curve(at.store, branch_id(c, o, s), t.metric, c, o.batch_responses)
            spent += int(cv.consumed)
            mine[s] = _ratio(cv, fresh[s], at.start, level, t.higher_is_better)
        ratios[o.label] = mine
    return OffPolicyBranches(c, base.label, level, ratios, spent)


TARGET_CAP = 2.0  # an off-policy branch to the target runs at most this x its k = 0 branch's samples


def _comparators_to_target(
    at: AtCheckpoint, base: Candidate, seeds: list[int]
) -> tuple[dict[int, BranchCurve], int]:
    """branch.offpolicy_read = "target": per seed, main candidate ``base`` (k = 0, label
    ``{base}-k0``) branched from the checkpoint to the target itself (at most budget.max_samples),
    and the samples they spent."""
    recipe, c, t = at.recipe, at.c, at.recipe.target
    me = dataclasses.replace(base, label=f"{base.label}-k0")
    budget = max(c + 1, recipe.budget.max_samples)
    stop = at.policy(t.value, budget, c, True)
    jobs = [Job(me, s, branch_id(c, me, s), budget, stop, {"resume_from": at.resume}) for s in seeds]
    at.check_start([j.rid for j in jobs])
    at.run(jobs)
    out = {s: stored_curve(at.store, branch_id(c, me, s), t.metric, c, me.batch_responses) for s in seeds}
    return out, sum(int(cv.consumed) for cv in out.values())


def _target_cap(at: AtCheckpoint, fresh: dict[int, BranchCurve]) -> int:
    """The budget of an off-policy branch read to the target: TARGET_CAP x its k = 0 branches' longest
    run past the checkpoint."""
    longest = max((cv.consumed for cv in fresh.values()), default=float(at.w))
    return min(at.recipe.budget.max_samples, at.c + math.ceil(TARGET_CAP * max(longest, 1.0)))


def _control_level(at: AtCheckpoint, wb: int) -> float:
    from batchtune.analysis.branched.ratios import control_level

    t = at.recipe.target
    return control_level(
        at.c, at.start, at.curves, at.b0, wb, t.higher_is_better, at.seeds, unit=at.recipe.sample_unit
    )


def geometric_ratio(ratios: dict[int, tuple[float, bool]]) -> float:
    """The geometric mean over seeds of one candidate's ratios (inf if any is censored or unpaired)."""
    vals = [r for r, cens in ratios.values()]
    if not vals or any(cens or not math.isfinite(r) for r, cens in ratios.values()):
        return math.inf
    return float(np.exp(np.mean(np.log(vals))))
