"""Adaptive refinement of the RL grid: the probe adds prompts P between grid points where the
critical batch's 1+tol crossing sits between them (issue 32).

On a doubling grid of P the critical batch is known only to the grid step its crossing falls in:
the shape-free crossing interval (analysis/sample/intervals.py) typically spans one to two steps,
and the critical batch (the largest measured batch at or below the crossing) is up to a doubling
below the truth. So after the grid, round k analyses the grid plus the candidates of rounds
1..k-1 and, for every step [P_a, P_b] of the main sweep that the crossing's 90% interval overlaps
and whose ratio is wider than 2^(1/4), adds P = round(sqrt(P_a P_b)) at the same G, at the LR of
the recipe's rule, at every seed of ``budget.seeds``: the step holding the crossing first, then
the others nearest it, ``PER_ROUND`` a round (one: a bisection that follows the crossing; two a
round narrowed the interval past its calibration, 84% coverage of a 90% interval on McCandlish
curves, benchmarks/out/rl_refine_recovery.txt). On a doubling grid that is a 2^(1/2) step,
then 2^(1/4) ones. It stops when no step needs a point (the goal: the interval within steps of
2^(1/4), or midpoints that round to a grid point), when the crossing is past the grid (no
critical batch in the measured range: nothing between grid points to pin down), or when
``probe.refine_rl_max_candidates`` were added (the budget; what it left out is said).
``probe.refine_rl = false`` turns it off.

Resumable like sequential seeding: each round is a function of the finished runs at the planned
seeds of the grid and of the rounds before it (``analyse`` sees no others), so a rerun replays
the same rounds and runs only what is unfinished. The added runs are ordinary runs (label
P{p}xG{g}) in the results store; the rounds and their reasons are written to ``refine_rl.json``
there, and the analysis, profile-gen's throughput (interpolated per batch) and ``recommend`` read
the added candidates from it (:func:`stored_plan`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from batchtune import codec
from batchtune.analysis.sample.critical import CriticalBatch
from batchtune.analysis.sample.efficiency import SampleEfficiency
from batchtune.backends.spec import Candidate
from batchtune.errors import InputError
from batchtune.measure.plan import Plan, lr_table, plan_candidates
from batchtune.recipe.schema import Recipe
from batchtune.records.files import atomic_write_text
from batchtune.records.store import ResultsStore

REFINE_FILE = "refine_rl.json"
FINE_STEP = 2.0**0.25  # the goal: grid steps this fine need no more points
PER_ROUND = 1  # candidates a round adds at most (module docstring)
MAX_ROUNDS = 8  # a guard only: the spacing halves in log each round, so a doubling grid needs 2


@dataclass(frozen=True)
class RLRefineRound:
    """One round: the prompts it added at ``group_size`` and why."""

    round: int
    prompts: tuple[int, ...]
    group_size: int
    reasons: tuple[str, ...]
    left_out: tuple[int, ...] = ()  # prompts the budget (probe.refine_rl_max_candidates) did not allow


def steps_to_split(
    prompts: Sequence[int], group_size: int, critical: CriticalBatch | None
) -> list[tuple[int, int, int]]:
    """(P_a, P_b, P_mid) for each step [P_a, P_b] of the sorted ``prompts`` that the shape-free
    crossing interval of ``critical`` overlaps, wider than 2^(1/4), whose midpoint
    round(sqrt(P_a P_b)) lies strictly inside: the step holding the crossing first, then by the
    log distance of the step from the crossing. [] without a finite shape-free crossing."""
    sf = critical.shape_free if critical is not None else None
    if sf is None or not math.isfinite(sf.crossing) or sf.crossing <= 0:
        return []
    lo, hi = sf.ci
    ps = sorted({int(p) for p in prompts if p > 0})
    out: list[tuple[float, int, int, int]] = []
    for a, b in zip(ps, ps[1:], strict=False):
        na, nb = a * group_size, b * group_size
        if not (na < hi and nb > lo) or b / a <= FINE_STEP * 1.01:  # 1%: whole prompts
            continue
        mid = round(math.sqrt(a * b))
        if not a < mid < b:
            continue
        x = sf.crossing
        dist = 0.0 if na <= x <= nb else min(abs(math.log(x / na)), abs(math.log(x / nb)))
        out.append((dist, a, b, mid))
    return [(a, b, m) for _, a, b, m in sorted(out)]


def next_round(
    prompts: Sequence[int],
    group_size: int,
    critical: CriticalBatch | None,
    budget_left: int,
    round_: int,
    lr_known: Callable[[int], bool] = lambda n: True,
    per_round: int = PER_ROUND,
) -> RLRefineRound | None:
    """The round after an analysis whose main sweep measured ``prompts`` and whose critical batch
    is ``critical``, or None when no step needs a point. ``lr_known(N)``: whether the recipe's
    LR rule has an LR for a batch of N responses (a table rule may not: that step is skipped)."""
    steps = [s for s in steps_to_split(prompts, group_size, critical) if lr_known(s[2] * group_size)]
    if not steps:
        return None
    take = steps[: max(0, min(per_round, budget_left))]
    left = [m for _, _, m in steps[len(take) : per_round]]
    sf = critical.shape_free if critical is not None else None
    assert sf is not None  # steps_to_split returns [] without one
    where = (
        f"crossing {sf.crossing:,.0f} responses, {100 * sf.confidence:.0f}% shape-free interval "
        f"[{sf.ci[0]:,.0f}, {sf.ci[1]:,.0f}]"
    )
    reasons = tuple(
        f"{where} spans N = {a * group_size:,}..{b * group_size:,} (wider than 2^(1/4)): "
        f"add P{m}xG{group_size} (N = {m * group_size:,})"
        for a, b, m in take
    )
    return RLRefineRound(
        round_, tuple(sorted(m for _, _, m in take)), group_size, reasons, tuple(sorted(left))
    )


def with_prompts(recipe: Recipe, plan: Plan, prompts: Sequence[int]) -> Plan:
    """``plan`` with main candidates at ``prompts`` (the recipe's G, the LR of its rule from the
    plan's reference batch) added; those already in it are kept as they are."""
    c = recipe.candidates
    more = sorted({int(p) for p in prompts} - {int(p) for p in c.prompts})
    if not more:
        return plan
    wide = dataclasses.replace(
        recipe,
        candidates=dataclasses.replace(c, prompts=[*c.prompts, *more]),
        lr_scaling=dataclasses.replace(recipe.lr_scaling, reference_batch=plan.reference_batch),
    )
    known = plan.by_label()
    new = [x for x in plan_candidates(wide).candidates if x.label not in known and x.prompts in more]
    new = [x for x in new if x.group_size == c.group_size and not x.fixed_lr and not x.staleness]
    every = {**known, **{x.label: x for x in new}}
    main = sorted({*plan.main, *(x.label for x in new)}, key=lambda lab: every[lab].batch_responses)
    return dataclasses.replace(plan, candidates=(*plan.candidates, *new), main=tuple(main))


def lr_known_for(recipe: Recipe) -> Callable[[int], bool]:
    """Whether the recipe's LR rule gives a batch of N responses an LR (a table rule: N a key)."""
    if recipe.lr_scaling.rule != "table":
        return lambda n: True
    table = lr_table(recipe)
    return lambda n: n in table


def refine_rounds(
    recipe: Recipe,
    store: ResultsStore,
    plan: Plan,
    analyse: Callable[[Plan], SampleEfficiency],
    run: Callable[[Plan, list[Candidate]], int],
) -> tuple[tuple[RLRefineRound, ...], Plan, int]:
    """Run the refinement rounds (module docstring) after ``plan``'s grid: ``analyse(plan)`` the
    store's runs of ``plan`` at the planned seeds, ``run(plan, cands)`` every planned seed of each
    candidate (or find them finished), returning the runs done. Returns the rounds, the plan with
    the added candidates, and the runs done."""
    if not recipe.probe.refine_rl or plan.reference not in plan.main:
        return (), plan, 0
    rounds: list[RLRefineRound] = []
    g, done, added = recipe.candidates.group_size, 0, 0
    lr_known = lr_known_for(recipe)
    by = plan.by_label()
    for k in range(1, MAX_ROUNDS + 1):
        prompts = [by[lab].prompts for lab in plan.main]
        eff = analyse(plan)
        r = next_round(prompts, g, eff.critical, recipe.probe.refine_rl_max_candidates - added, k, lr_known)
        if r is None:
            break
        rounds.append(r)
        write_rounds(store, rounds)
        if not r.prompts:  # only what the budget left out
            break
        plan = with_prompts(recipe, plan, [*prompts, *r.prompts])
        by = plan.by_label()
        done += run(plan, [by[lab] for lab in plan.main if by[lab].prompts in r.prompts])
        added += len(r.prompts)
    return tuple(rounds), plan, done


def write_rounds(store: ResultsStore, rounds: Sequence[RLRefineRound]) -> None:
    data = {"rounds": [dataclasses.asdict(r) for r in rounds]}
    atomic_write_text(store.root / REFINE_FILE, codec.dumps(data, indent=2) + "\n")


def read_rounds(store: ResultsStore) -> tuple[RLRefineRound, ...]:
    """The rounds recorded in ``store`` (none when it holds no record); a record that is not one
    is an input error naming it (its runs are in the store: dropping them silently would not do)."""
    path = store.root / REFINE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    except OSError as exc:
        raise InputError(f"{path}: unreadable ({exc.strerror or exc})") from None
    data = codec.loads(text, str(path))
    try:
        return tuple(_round_of(r) for r in data["rounds"])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise InputError(f"{path} is not a record of refinement rounds; delete it to rerun them") from None


def _round_of(r: Mapping[str, object]) -> RLRefineRound:
    def ints(key: str) -> tuple[int, ...]:
        v = r.get(key, ())
        return tuple(int(x) for x in v) if isinstance(v, list | tuple) else ()

    reasons = r.get("reasons", ())
    return RLRefineRound(
        round=int(str(r["round"])),
        prompts=ints("prompts"),
        group_size=int(str(r["group_size"])),
        reasons=tuple(str(x) for x in reasons) if isinstance(reasons, list | tuple) else (),
        left_out=ints("left_out"),
    )


def stored_plan(recipe: Recipe, store: ResultsStore, plan: Plan | None = None) -> Plan:
    """``plan`` (default: the recipe's) with the candidates the store's refinement rounds added at
    the recipe's G (whatever ``probe.refine_rl`` says now: their runs are in the store)."""
    plan = plan_candidates(recipe) if plan is None else plan
    if recipe.study.pretrain:
        return plan
    g = recipe.candidates.group_size
    added = [p for r in read_rounds(store) if r.group_size == g for p in r.prompts]
    return with_prompts(recipe, plan, added) if added else plan


def rounds_note(rounds: Sequence[RLRefineRound]) -> str:
    """One line on what the rounds added, or "" when none did."""
    parts = [
        f"round {r.round} added {', '.join(f'P{p}xG{r.group_size}' for p in r.prompts)}"
        for r in rounds
        if r.prompts
    ]
    left = sorted({p for r in rounds for p in r.left_out})
    if left:
        parts.append(f"not added (probe.refine_rl_max_candidates reached): P {', '.join(map(str, left))}")
    if not parts:
        return ""
    return "refinement between grid points (probe.refine_rl): " + "; ".join(parts)


def addable(prompts: Sequence[int]) -> tuple[set[int], int]:
    """Every P the rounds could ever add to ``prompts``, wherever the crossing falls, and the
    rounds that takes: the midpoints of every step wider than 2^(1/4), then of the grid with them,
    until none is left."""
    grid = {int(p) for p in prompts if p > 0}
    out: set[int] = set()
    rounds = 0
    while rounds < MAX_ROUNDS:
        g = sorted(grid)
        new = {round(math.sqrt(a * b)) for a, b in zip(g, g[1:], strict=False) if b / a > FINE_STEP * 1.01}
        new = {m for m in new if m not in grid and min(g) < m < max(g)}
        if not new:
            break
        out |= new
        grid |= new
        rounds += 1
    return out, rounds


def refine_bound(recipe: Recipe) -> tuple[int, int]:
    """(candidates, runs) the RL refinement may add at most: no more than the grid can take
    (:func:`addable`), capped by ``probe.refine_rl_max_candidates``; (0, 0) when it is off or the
    study is not an RL grid. (Sequential seeding may add seeds to them too: budget.max_extra_seeds.)"""
    if not recipe.probe.refine_rl or recipe.study.pretrain or recipe.study.branched:
        return 0, 0
    possible, _ = addable(recipe.candidates.prompts)
    cands = min(recipe.probe.refine_rl_max_candidates, len(possible))
    return cands, cands * len(recipe.budget.seeds)


def plan_note(recipe: Recipe, run_s_max: float) -> tuple[str, int]:
    """The plan's line on the refinement rounds of an RL grid and the runs they may add: an upper
    bound (every added run to ``budget.max_samples``, at the slowest grid run's ``run_s_max``)."""
    if not recipe.probe.refine_rl:  # the default: the plan says nothing of it
        return "", 0
    cands, runs = refine_bound(recipe)
    if cands == 0:
        return "refinement: no prompts to add (the grid of P is 2^(1/4) or finer)", 0
    wall = f", at most {runs * run_s_max:,.0f} s" if math.isfinite(run_s_max) else ""
    samples = runs * recipe.budget.max_samples
    return (
        f"refinement rounds (not in the totals above): where the critical batch's crossing interval "
        f"spans a step of P the probe adds P between (2^(1/2), then 2^(1/4) steps), at most {cands} "
        f"candidate(s) = {runs} run(s) = {samples:,} samples{wall} (upper bound; "
        f"probe.refine_rl_max_candidates = {recipe.probe.refine_rl_max_candidates})"
    ), runs


def refinement_note(recipe: Recipe, run_s_max: float) -> tuple[str, int]:
    """The plan's line on the refinement rounds ("" = none to say) and the runs they may add, for
    a pre-training grid (measure/pretrain_refine.py) or an RL one (:func:`plan_note`)."""
    if recipe.study.branched:
        return "", 0
    if recipe.study.pretrain:
        from batchtune.measure import pretrain_refine

        return pretrain_refine.plan_note(recipe, run_s_max), pretrain_refine.refine_bound(recipe)[1]
    return plan_note(recipe, run_s_max)
