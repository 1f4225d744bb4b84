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
pre-training grid, which measures B_opt rather than time) is the grid, and the reason says which. An
off-policy sweep stays on the grid by measurement: branched at one checkpoint, its staleness cells
picked a delayed-gradient candidate that diverges in a full run in 2 of 12 NQM probes and one
at regret 1.095-1.740 in 3 more, the grid none in 6 (benchmarks/branched_async.py);
`probe.mode = "branched"` still runs them when asked.

With `branch.size_to_run = true`, a branched probe is sized to the run (``sized_to_run``): its trunk
and windows take the same shares of the stated run as the setting measured on nqm-long (a trunk of
2,048 and windows of 1,024 samples in a 224k-sample run: regret 1.000 on 8 of 8 seed sets at
0.19-0.27x the run), so they grow in proportion to a longer run, and the checkpoints (the branch
points) keep their fractions of the trunk and their number. The recipe's `[branch]` values are the
least they can be (a short run keeps the measured defaults). It is off by default: on the NQM the
recipe's fixed sizes cost a third to a sixth as much and picked the best batch as often
(docs/branched.md). The bound the choice is weighed by is the probe's as it will run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from batchtune.errors import RecipeError
from batchtune.recipe.checks import check_recipe
from batchtune.recipe.schema import Recipe
from batchtune.recipe.study import AUTO_MODE as AUTO

# measured (benchmarks/out/branched_async.txt): off-policy branches read a short window at one
# checkpoint, where a delayed gradient near its stability edge still keeps up
OFFPOLICY_REASON = (
    "this recipe sweeps staleness or reuse, and off-policy branches misread it: on the NQM they picked a "
    "candidate that never reaches the target in 2 of 12 probes (regret 1.740 and 1.095 on 3 more), the "
    "grid 6 of 6 at regret 1.000 (benchmarks/branched_async.py; docs/async.md)"
)
TRUNK_SHARE = 0.25  # a branched probe's trunk at most this share of the full run (module doc)
GRID, BRANCHED = "grid", "branched"
# the shares of the run auto sizes a branched probe's trunk and windows to: the setting measured on
# nqm-long, 2,048 and 1,024 samples of its 875-step run at 256 (benchmarks/out/probe_sized.txt)
RUN_TRUNK_SHARE = 2048 / (875 * 256)
RUN_WINDOW_SHARE = 1024 / (875 * 256)


@dataclass(frozen=True)
class ProbeChoice:
    """What `probe.mode = "auto"` resolved to, and why (shown by `plan`, `probe`, `tune`)."""

    mode: str  # grid | branched
    reason: str
    full_run_samples: int = 0  # the stated full run in samples; 0 = not stated
    grid_samples: float = math.nan  # the grid's predicted samples (about one full run per run)
    branched_samples_max: float = math.nan  # the branched plan's bound
    trunk_samples: int = 0  # the branched probe's sizes, as sized to the run (0: not weighed)
    window_samples: int = 0


def full_run_samples(recipe: Recipe) -> int:
    """The full run the recipe states, in samples (0: none stated)."""
    b = recipe.budget
    if b.full_run_samples:
        return b.full_run_samples
    if not b.full_run_steps:
        return 0
    return b.full_run_steps * (b.full_run_batch or middle_batch(recipe))


def _main_batches(recipe: Recipe) -> list[int]:
    from batchtune.measure.plan import plan_candidates

    plan = plan_candidates(_as(recipe, GRID))
    return sorted(c.batch_responses for c in plan.candidates if c.label in plan.main)


def middle_batch(recipe: Recipe) -> int:
    """The geometric middle of the main candidates' batches (samples a step), rounded to one of them."""
    batches = _main_batches(recipe)
    return batches[(len(batches) - 1) // 2]


def sized_to_run(recipe: Recipe, full: int) -> Recipe:
    """``recipe`` with its branched trunk and windows sized to a full run of ``full`` samples: shares
    RUN_TRUNK_SHARE and RUN_WINDOW_SHARE of it, in whole steps of the trunk's batch, never below the
    recipe's own values; as given where nothing is stated or `branch.size_to_run` is false."""
    b = recipe.branch
    if full <= 0 or not b.size_to_run:
        return recipe
    step = _main_batches(recipe)[0]  # the trunk runs at the reference, the smallest main batch

    def whole(share: float) -> int:
        return max(1, math.ceil(round(share * full / step, 6))) * step

    trunk = max(b.trunk_samples, whole(RUN_TRUNK_SHARE))
    window = max(b.window_samples, whole(RUN_WINDOW_SHARE))
    branch = dataclasses.replace(b, trunk_samples=trunk, window_samples=window)
    return dataclasses.replace(recipe, branch=branch)


def _sizes(recipe: Recipe, sized: Recipe) -> str:
    """What the branched probe's sizes are and where they come from, for the reason."""
    from batchtune.measure.branched import checkpoint_positions

    b, given = sized.branch, recipe.branch
    points = checkpoint_positions(sized, _main_batches(sized)[0])
    at = f"{len(points)} branch point(s), at " + ", ".join(f"{p:,}" for p in points)
    sizes = f"trunk {b.trunk_samples:,} samples, windows of {b.window_samples:,}, {at}"
    if not given.size_to_run:
        return f"{sizes} (the recipe's [branch]; branch.size_to_run = true sizes them to the run)"
    if (b.trunk_samples, b.window_samples) == (given.trunk_samples, given.window_samples):
        return f"{sizes} (the recipe's [branch], the least auto uses: the run is too short to grow them)"
    return (
        f"{sizes}: sized to the run ({RUN_TRUNK_SHARE:.1%} and {RUN_WINDOW_SHARE:.2%} of it, as measured "
        f"on nqm-long; the recipe's {given.trunk_samples:,} and {given.window_samples:,} the least)"
    )


def _as(recipe: Recipe, mode: str) -> Recipe:
    return dataclasses.replace(recipe, probe=dataclasses.replace(recipe.probe, mode=mode))


def _why_not_branched(recipe: Recipe) -> str | None:
    """Why a branched probe cannot answer this recipe, or None."""
    from batchtune import backends
    from batchtune.measure.async_topup import has_async_knobs
    from batchtune.recipe.study import kind_of

    if kind_of(recipe.backend.training, GRID).pretrain:
        return "a pre-training grid measures B_opt and B_min per loss, which branches do not"
    if recipe.algorithm.mode != "sync":
        return "the two-process async run was never measured with branches"
    if has_async_knobs(recipe):
        return OFFPOLICY_REASON
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
    sized = sized_to_run(recipe, full)
    branched = float(branched_plan_preview(_as(sized, BRANCHED), 0).total_samples_max)
    trunk, window = sized.branch.trunk_samples, sized.branch.window_samples
    costs = (
        f"the grid about {grid / full:.1f}x one full run ({full:,} samples), a branched probe at most "
        f"{branched / full:.2f}x; its trunk is {trunk / full:.0%} of the run"
    )
    sizes = (full, grid, branched, trunk, window)
    if trunk > TRUNK_SHARE * full:
        why = f"a trunk of {trunk:,} samples is over {TRUNK_SHARE:.0%} of the run, where branches misread"
        return ProbeChoice(GRID, f"auto chose the grid: {why} ({costs}){_short(recipe, full)}", *sizes)
    if branched >= grid:
        why = f"it costs no more ({costs}){_short(recipe, full)}"
        return ProbeChoice(GRID, f"auto chose the grid: {why}", *sizes)
    return ProbeChoice(BRANCHED, f"auto chose branched: {costs}; {_sizes(recipe, sized)}", *sizes)


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
    if choice.mode == BRANCHED:
        recipe = sized_to_run(recipe, choice.full_run_samples)
    out = dataclasses.replace(_as(recipe, choice.mode), probe_choice=choice.reason)
    errors = check_recipe(out)
    if errors:
        where = f" in {recipe.source}" if recipe.source else ""
        raise RecipeError(f"{len(errors)} problem(s){where}: " + "; ".join(errors))
    return out
