"""`probe.mode = "auto"`: a probe sized to the run it tunes (grid or branched, from the recipe alone).

The recipe states the full run it is for (`budget.full_run_samples`, or `budget.full_run_steps` at
`budget.full_run_batch` samples a step). Against it, before anything runs:

- the grid costs about one full run per grid run (every candidate at every seed runs to the target;
  a larger batch needs more samples, one outside the band is stopped early): 20-35x one run as
  shipped;
- a branched probe costs at most its plan's bound (measure/preview_branched.py), which does not grow
  with the run: its trunk, checkpoints and windows are the recipe's `[branch]` settings.

Branched is chosen where it is cheaper than the grid even at its bound, and its trunk is at most
`TRUNK_SHARE` of the full run: that is where it was measured at regret <= 1.05 on every seed
(docs/branched.md: on the NQM the trunk was 2-16% of the run, 48 of 48 one-seed probes at regret
1.000; on tiny-grpo and tiny-ppo it was 40-55% and missed on one of six seed sets, at 1.50). Anything
else (no full run stated, a backend that cannot resume a checkpoint, an off-policy or async sweep, a
pre-training grid, which measures B_opt rather than time) is the grid, and the reason says which.
The `[branch]` sizes are kept as the recipe gives them (the measured defaults); the choice says
what they cost against the run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from batchtune.errors import RecipeError
from batchtune.recipe.checks import check_recipe
from batchtune.recipe.schema import Recipe
from batchtune.recipe.study import AUTO_MODE as AUTO

TRUNK_SHARE = 0.25  # a branched probe's trunk at most this share of the full run (module doc)
GRID, BRANCHED = "grid", "branched"


@dataclass(frozen=True)
class ProbeChoice:
    """What `probe.mode = "auto"` resolved to, and why (shown by `plan`, `probe`, `tune`)."""

    mode: str  # grid | branched
    reason: str
    full_run_samples: int = 0  # the stated full run in samples; 0 = not stated
    grid_samples: float = math.nan  # the grid's predicted samples (about one full run per run)
    branched_samples_max: float = math.nan  # the branched plan's bound


def full_run_samples(recipe: Recipe) -> int:
    """The full run the recipe states, in samples (0: none stated)."""
    b = recipe.budget
    if b.full_run_samples:
        return b.full_run_samples
    if not b.full_run_steps:
        return 0
    return b.full_run_steps * (b.full_run_batch or middle_batch(recipe))


def middle_batch(recipe: Recipe) -> int:
    """The geometric middle of the main candidates' batches (samples a step), rounded to one of them."""
    from batchtune.measure.plan import plan_candidates

    plan = plan_candidates(_as(recipe, GRID))
    batches = sorted(c.batch_responses for c in plan.candidates if c.label in plan.main)
    return batches[(len(batches) - 1) // 2]


def _as(recipe: Recipe, mode: str) -> Recipe:
    return dataclasses.replace(recipe, probe=dataclasses.replace(recipe.probe, mode=mode))


def _why_not_branched(recipe: Recipe) -> str | None:
    """Why a branched probe cannot answer this recipe, or None."""
    from batchtune import backends
    from batchtune.recipe.study import kind_of

    if kind_of(recipe.backend.training, GRID).pretrain:
        return "a pre-training grid measures B_opt and B_min per loss, which branches do not"
    if recipe.algorithm.mode != "sync" or recipe.probe.staleness != [0] or recipe.probe.updates_per_batch:
        return "branches run on-policy and in sync only, and this recipe sweeps staleness or runs async"
    return backends.checkpoint_problem(recipe)


def choose_probe(recipe: Recipe) -> ProbeChoice:
    """Grid or branched for ``recipe`` (its probe.mode is ignored), with the reason (module doc)."""
    full = full_run_samples(recipe)
    if full <= 0:
        return ProbeChoice(
            GRID,
            "auto chose the grid: no full run stated (budget.full_run_samples or full_run_steps), and on "
            "short runs the grid's answer is the safer one",
        )
    problem = _why_not_branched(recipe)
    if problem is not None:
        return ProbeChoice(GRID, f"auto chose the grid: {problem}", full)
    from batchtune.measure.preview import grid_samples_max
    from batchtune.measure.preview_branched import branched_plan_preview

    grid_recipe = _as(recipe, GRID)
    runs = grid_samples_max(grid_recipe) / max(1, recipe.budget.max_samples)  # runs, in whole steps
    grid = runs * full
    branched = float(branched_plan_preview(_as(recipe, BRANCHED), 0).total_samples_max)
    trunk = recipe.branch.trunk_samples
    costs = (
        f"the grid about {grid / full:.1f}x one full run ({full:,} samples), a branched probe at most "
        f"{branched / full:.2f}x; its trunk is {trunk / full:.0%} of the run"
    )
    if trunk > TRUNK_SHARE * full:
        why = f"a trunk of {trunk:,} samples is over {TRUNK_SHARE:.0%} of the run, where branches misread"
        return ProbeChoice(
            GRID, f"auto chose the grid: {why} ({costs}){_short(recipe, full)}", full, grid, branched
        )
    if branched >= grid:
        why = f"it costs no more ({costs}){_short(recipe, full)}"
        return ProbeChoice(GRID, f"auto chose the grid: {why}", full, grid, branched)
    return ProbeChoice(BRANCHED, f"auto chose branched: {costs}", full, grid, branched)


def _short(recipe: Recipe, full: int) -> str:
    """A warning where the grid's runs stop (budget.max_samples) before the stated run's length."""
    m = recipe.budget.max_samples
    if m >= full:
        return ""
    return f"; budget.max_samples ({m:,}) is shorter than the run, so grid runs may stop before the target"


def resolved(recipe: Recipe) -> Recipe:
    """``recipe`` at the mode auto chose, the reason kept in ``probe_choice``, checked again as what it
    became; any other mode is returned as given. The workflow applies it to every recipe it loads."""
    if recipe.probe.mode != AUTO:
        return recipe
    choice = choose_probe(recipe)
    out = dataclasses.replace(_as(recipe, choice.mode), probe_choice=choice.reason)
    errors = check_recipe(out)
    if errors:
        where = f" in {recipe.source}" if recipe.source else ""
        raise RecipeError(f"{len(errors)} problem(s){where}: " + "; ".join(errors))
    return out
