"""Adaptive refinement of the pre-training grid: the probe adds the batches between grid points
where B_opt sits between them (issue 32; analysis/pretrain/refine.py says which).

On a doubling grid the measured B_opt is known only to its bracket; the same estimator is within a
few % on a 2^(1/4) grid (benchmarks/out/pretrain_recovery.txt). So after the recipe's grid, round
k analyses the grid plus the batches of rounds 1..k-1 and, for every target loss whose measured
minimum has a neighbour wider than 2^(1/4) away, adds the geometric midpoint towards it (2^(1/2)
steps on a doubling grid, then 2^(1/4)), in whole sequences, at every seed of ``budget.seeds``.
It stops when no target needs a batch (the goal: spacing 2^(1/4) on both sides of every measured
minimum, or batches that would round to a grid point), or when ``probe.refine_max_batches``
batches were added (the budget; what it left out is said). ``probe.refine = false`` only names them.

Resumable like sequential seeding: each round's batches are a function of the finished runs of
the grid and of the rounds before it, so a rerun replays the same rounds and runs only what is
unfinished. The added runs are ordinary runs (label ``B{tokens}``) in the results store; the
rounds and their reasons are written to ``refine.json`` there and carried by the probe's result.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batchtune import codec
from batchtune.analysis.pretrain.batch import BatchEstimate
from batchtune.analysis.pretrain.grid import GridAnalysis
from batchtune.analysis.pretrain.refine import FINE_STEP, batches_to_add
from batchtune.recipe.schema import Recipe
from batchtune.records.files import atomic_write_text
from batchtune.records.store import ResultsStore

REFINE_FILE = "refine.json"
MAX_ROUNDS = 8  # a guard only: the spacing halves in log each round, so a doubling grid needs 2


@dataclass(frozen=True)
class RefineRound:
    """One round: the batches it added (tokens) and why, target by target."""

    round: int
    batches_tokens: tuple[int, ...]
    reasons: tuple[str, ...]
    left_out: tuple[int, ...] = ()  # batches the budget (probe.refine_max_batches) did not allow


def _why(est: BatchEstimate, add: Sequence[int]) -> str:
    b = est.b_opt_measured_tokens or math.nan
    lo, hi = est.b_opt_bracket or (math.nan, math.nan)
    return (
        f"L={est.target_loss:g}: B_opt measured at {b:,.0f} tokens, bracket {lo:,.0f}..{hi:,.0f} "
        f"(spacing wider than 2^(1/4)): add {', '.join(f'{x:,}' for x in add)}"
    )


def next_round(analysis: GridAnalysis, seq_len: int, budget_left: int, round_: int) -> RefineRound | None:
    """The round after ``analysis`` (of the grid and the rounds so far), or None when no target
    needs a batch. Targets are taken in the analysis' order (easiest loss first) while the budget
    lasts; a target's batches are added whole or not at all."""
    added: list[int] = []
    reasons: list[str] = []
    left: list[int] = []
    for est in analysis.estimates:
        want = batches_to_add(est.batches_tokens, est.b_opt_measured_tokens, seq_len, FINE_STEP)
        add = [b for b in want if b not in added]
        if not want:
            continue
        if len(added) + len(add) > budget_left:
            left += [b for b in add if b not in left]
            continue
        added += add
        reasons.append(_why(est, want))
    if not added and not left:
        return None
    return RefineRound(round_, tuple(sorted(added)), tuple(reasons), tuple(sorted(left)))


def refine_grid(
    recipe: Recipe,
    store: ResultsStore,
    analyse: Callable[[set[int] | None], GridAnalysis],
    run_batches: Callable[[Sequence[int]], int],
) -> tuple[tuple[RefineRound, ...], int]:
    """Run the refinement rounds of ``recipe``'s grid probe (module docstring): ``analyse(batches)``
    analyses the store's runs at those batches, ``run_batches(batches)`` runs (or finds finished)
    every seed at each and returns the runs done. Returns the rounds and the runs done."""
    grid = {int(b) for b in recipe.pretrain.batches_tokens}
    if not recipe.probe.refine:
        return (), 0
    rounds: list[RefineRound] = []
    known, done = set(grid), 0
    budget = recipe.probe.refine_max_batches
    for k in range(1, MAX_ROUNDS + 1):
        spent = len(known - grid)
        r = next_round(analyse(set(known)), recipe.pretrain.seq_len, budget - spent, k)
        if r is None:
            break
        rounds.append(r)
        write_rounds(store, rounds)
        if not r.batches_tokens:  # only what the budget left out
            break
        done += run_batches(r.batches_tokens)
        known |= set(r.batches_tokens)
    return tuple(rounds), done


def write_rounds(store: ResultsStore, rounds: Sequence[RefineRound]) -> None:
    data = {"rounds": [dataclasses.asdict(r) for r in rounds]}
    atomic_write_text(store.root / REFINE_FILE, codec.dumps(data, indent=2) + "\n")


def addable(batches: Sequence[float], seq_len: int) -> tuple[set[int], int]:
    """Every batch the rounds could ever add to ``batches``, wherever B_opt falls, and the rounds
    that takes: the midpoints of every pair of neighbours wider than 2^(1/4) apart, in whole
    sequences, then of the grid with them, until none is left."""
    grid = {float(b) for b in batches if b > 0}
    out: set[int] = set()
    rounds = 0
    while rounds < MAX_ROUNDS:
        g = sorted(grid)
        new = {add for m in g for add in batches_to_add(g, m, seq_len, FINE_STEP) if add not in grid}
        if not new:
            break
        out |= new
        grid |= {float(b) for b in new}
        rounds += 1
    return out, rounds


def refine_bound(recipe: Recipe) -> tuple[int, int]:
    """(batches, runs) the refinement may add at most: two batches per target loss a round, for
    the rounds the grid needs, no more than the grid can take (:func:`addable`), capped by
    ``probe.refine_max_batches``; (0, 0) when refinement is off."""
    if not recipe.probe.refine:
        return 0, 0
    targets = max(1, len(recipe.pretrain.targets))
    possible, rounds = addable(recipe.pretrain.batches_tokens, recipe.pretrain.seq_len)
    batches = min(recipe.probe.refine_max_batches, 2 * targets * rounds, len(possible))
    return batches, batches * len(recipe.budget.seeds)


def plan_note(recipe: Recipe, run_s_max: float) -> str:
    """The plan's line on the refinement rounds: their cost as an upper bound (every added run to
    the run budget, at the slowest grid run's time ``run_s_max``)."""
    if not recipe.probe.refine:
        return "refinement off (probe.refine = false): B_opt between grid points is named, not refined"
    batches, runs = refine_bound(recipe)
    if batches == 0:
        return (
            "refinement: no batch to add (the grid is 2^(1/4) or finer, or a midpoint would round to a "
            "grid point in whole sequences)"
        )
    tokens = runs * recipe.pretrain.max_tokens
    wall = f", at most {runs * run_s_max:,.0f} s" if math.isfinite(run_s_max) else ""
    return (
        f"refinement rounds (not in the totals above): where B_opt sits between grid points the probe "
        f"adds batches (2^(1/2), then 2^(1/4) steps), at most {batches} batch(es) = {runs} run(s) = "
        f"{tokens:,} tokens{wall} (upper bound; probe.refine_max_batches = "
        f"{recipe.probe.refine_max_batches}, probe.refine = false to only name them)"
    )
