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

Then, with ``probe.refine_seeds`` above the number of ``budget.seeds``, one **seed round**: near its
minimum E(B) is flat, so where a target's measured minimum has a neighbour within the seeds'
noise of it (:func:`within_noise`), the batches within ``SEED_WINDOW`` of that minimum are run at
more seeds, up to ``refine_seeds`` (the new seeds follow the largest of ``budget.seeds``), at most
2 x ``probe.refine_max_batches`` batches. The B_opt fit weighs a batch by its seeds
(analysis/pretrain/bopt_fit.py). The seed round is a function of the runs at ``budget.seeds``
only, so it replays too; it is recorded as a round with its ``seeds``.
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
SEED_WINDOW = 2.0**0.5  # the seed round runs more seeds at the batches within this factor of B_opt
NOISE_Z = 2.0  # a neighbour within this many standard errors of the minimum's log tokens is "within noise"
MAX_ROUNDS = 8  # a guard only: the spacing halves in log each round, so a doubling grid needs 2


@dataclass(frozen=True)
class RefineRound:
    """One round: the batches it added (tokens) and why, target by target."""

    round: int
    batches_tokens: tuple[int, ...]
    reasons: tuple[str, ...]
    left_out: tuple[int, ...] = ()  # batches the budget (probe.refine_max_batches) did not allow
    seeds: tuple[int, ...] = ()  # a seed round: the seeds it added at its batches; () = budget.seeds


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


Analyse = Callable[[set[int] | None, set[int] | None], GridAnalysis]
RunBatches = Callable[[Sequence[int], Sequence[int] | None], int]


def refine_grid(
    recipe: Recipe, store: ResultsStore, analyse: Analyse, run_batches: RunBatches
) -> tuple[tuple[RefineRound, ...], int]:
    """Run the refinement rounds of ``recipe``'s grid probe (module docstring): ``analyse(batches,
    seeds)`` analyses the store's runs at those batches and seeds (None: all), ``run_batches(batches,
    seeds)`` runs (or finds finished) each seed (None: ``budget.seeds``) at each batch and returns the
    runs done. Returns the rounds and the runs done."""
    grid = {int(b) for b in recipe.pretrain.batches_tokens}
    if not recipe.probe.refine:
        return (), 0
    rounds: list[RefineRound] = []
    known, done = set(grid), 0
    base = set(recipe.budget.seeds)
    budget = recipe.probe.refine_max_batches
    k = 1
    for k in range(1, MAX_ROUNDS + 1):
        spent = len(known - grid)
        r = next_round(analyse(set(known), base), recipe.pretrain.seq_len, budget - spent, k)
        if r is None:
            break
        rounds.append(r)
        write_rounds(store, rounds)
        if not r.batches_tokens:  # only what the budget left out
            break
        done += run_batches(r.batches_tokens, None)
        known |= set(r.batches_tokens)
    extra = extra_seeds(recipe)
    if extra:
        s = seed_round(analyse(set(known), base), extra, seed_batches(recipe), len(rounds) + 1)
        if s is not None:
            rounds.append(s)
            write_rounds(store, rounds)
            done += run_batches(s.batches_tokens, s.seeds) if s.batches_tokens else 0
    return tuple(rounds), done


def seed_batches(recipe: Recipe) -> int:
    """The most batches the seed round may run more seeds at: 2 x probe.refine_max_batches."""
    return 2 * recipe.probe.refine_max_batches


def extra_seeds(recipe: Recipe) -> tuple[int, ...]:
    """The seeds the seed round adds (module docstring): () when it is off."""
    seeds = list(recipe.budget.seeds)
    more = recipe.probe.refine_seeds - len(seeds)
    return tuple(range(max(seeds) + 1, max(seeds) + 1 + more)) if more > 0 and recipe.probe.refine else ()


def within_noise(est: BatchEstimate) -> bool:
    """Whether a grid neighbour of the measured minimum reads within ``NOISE_Z`` standard errors
    of it in log tokens (the seeds' spread, ``est.log_tokens_se``; False without it)."""
    if est.b_opt_measured_tokens is None or not est.log_tokens_se:
        return False
    k = est.batches_tokens.index(est.b_opt_measured_tokens)
    e, se = est.tokens_to_target, est.log_tokens_se
    near = [j for j in (k - 1, k + 1) if 0 <= j < len(e) and math.isfinite(e[j] * se[j] * se[k])]
    return any(math.log(e[j] / e[k]) <= NOISE_Z * math.hypot(se[j], se[k]) for j in near)


def seed_round(
    analysis: GridAnalysis, seeds: Sequence[int], max_batches: int, round_: int
) -> RefineRound | None:
    """The seed round after ``analysis`` (the runs at ``budget.seeds``): ``seeds`` at the batches
    within SEED_WINDOW of each target's measured minimum where a neighbour is within noise of it,
    targets taken in order while ``max_batches`` lasts (a target's batches whole or not at all)."""
    added: list[int] = []
    reasons: list[str] = []
    left: list[int] = []
    for est in analysis.estimates:
        if not within_noise(est) or est.b_opt_measured_tokens is None:
            continue
        m = est.b_opt_measured_tokens
        near = [int(b) for b in est.batches_tokens if abs(math.log(b / m)) <= math.log(SEED_WINDOW) * 1.01]
        add = [b for b in near if b not in added]
        if len(added) + len(add) > max_batches:
            left += [b for b in add if b not in left]
            continue
        added += add
        listed = ", ".join(f"{b:,}" for b in near)
        reasons.append(
            f"L={est.target_loss:g}: a neighbour of the measured minimum {m:,.0f} is within the seeds' "
            f"noise of it: seeds {', '.join(map(str, seeds))} at {listed}"
        )
    if not added and not left:
        return None
    return RefineRound(round_, tuple(sorted(added)), tuple(reasons), tuple(sorted(left)), tuple(seeds))


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
    ``probe.refine_max_batches``, each at every seed; then the seed round's extra seeds at up to
    2 x ``probe.refine_max_batches`` batches (runs only: it adds no batch); (0, 0) when off."""
    if not recipe.probe.refine:
        return 0, 0
    targets = max(1, len(recipe.pretrain.targets))
    possible, rounds = addable(recipe.pretrain.batches_tokens, recipe.pretrain.seq_len)
    batches = min(recipe.probe.refine_max_batches, 2 * targets * rounds, len(possible))
    seeded = min(seed_batches(recipe), len(recipe.pretrain.batches_tokens) + batches)
    return batches, batches * len(recipe.budget.seeds) + seeded * len(extra_seeds(recipe))


def plan_note(recipe: Recipe, run_s_max: float) -> str:
    """The plan's line on the refinement rounds: their cost as an upper bound (every added run to
    the run budget, at the slowest grid run's time ``run_s_max``)."""
    if not recipe.probe.refine:
        return "refinement off (probe.refine = false): B_opt between grid points is named, not refined"
    batches, runs = refine_bound(recipe)
    extra = extra_seeds(recipe)
    if runs == 0:
        return (
            "refinement: no batch to add (the grid is 2^(1/4) or finer, or a midpoint would round to a "
            "grid point in whole sequences)"
        )
    tokens = runs * recipe.pretrain.max_tokens
    wall = f", at most {runs * run_s_max:,.0f} s" if math.isfinite(run_s_max) else ""
    seeds = (
        f"; then seeds {', '.join(map(str, extra))} at up to {seed_batches(recipe)} batch(es) "
        f"beside B_opt where its neighbours are within noise "
        f"(probe.refine_seeds = {recipe.probe.refine_seeds})"
        if extra
        else ""
    )
    return (
        f"refinement rounds (not in the totals above): where B_opt sits between grid points the probe "
        f"adds batches (2^(1/2), then 2^(1/4) steps), at most {batches} batch(es){seeds} = "
        f"{runs} run(s) = {tokens:,} tokens{wall} (upper bound; probe.refine_max_batches = "
        f"{recipe.probe.refine_max_batches}, probe.refine = false to only name them)"
    )
