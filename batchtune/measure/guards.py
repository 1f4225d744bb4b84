"""Fail-fast checks of a probe: an unreachable target or a metric the backend never logs is found
before the budget is spent, not after every run has run to its end."""

from __future__ import annotations

import re

from batchtune import backends
from batchtune.errors import MetricMissingError, RecipeError
from batchtune.recipe.schema import Recipe

# words that mark a held-out metric, as whole words of its name ("eval_reward", "val/loss",
# "test-acc"); "value_loss" (a PPO critic's) is a training metric
_EVAL_WORDS = frozenset({"eval", "evaluation", "val", "valid", "validation", "test", "heldout"})


def _is_eval(name: str) -> bool:
    return any(word in _EVAL_WORDS for word in re.split(r"[/_\-.: ]", name.lower()))


def check_metric_present(metric: str, metrics: dict[str, float], logged: set[str]) -> None:
    """Fail fast when the target metric is missing from the first evaluation of a run.

    A step "evaluates" the target when it logs a metric of the same kind (held-out names hold the
    word eval/val/validation/test; training ones do not). Raised there, the probe stops before
    spending its budget; the message lists ``logged``, every metric name the run has logged so far."""
    if not metrics or metric in metrics:
        return
    if any(_is_eval(k) == _is_eval(metric) for k in metrics):
        raise MetricMissingError(
            f"target.metric {metric!r} is not logged by this run, which logs "
            f"{', '.join(sorted(logged))}: set --set target.metric=NAME to one of them"
        )


def target_range_problem(recipe: Recipe) -> str | None:
    """Why no run could reach the target: it lies outside the range the training backend declares
    for its metric (``metric_ranges``); None when it lies inside or nothing is declared."""
    cls = backends.load("training", recipe.backend.training)
    ranges = cls.metric_ranges(recipe) if hasattr(cls, "metric_ranges") else {}
    t = recipe.target
    if t.metric not in ranges:
        return None
    lo, hi = ranges[t.metric]
    reachable = t.value <= hi if t.higher_is_better else t.value >= lo
    if reachable:
        return None
    return (
        f"target.value {t.value:g} is outside {t.metric}'s range [{lo:g}, {hi:g}] "
        f"({'higher' if t.higher_is_better else 'lower'} is better), so no run could reach it; "
        "choose a target inside the range"
    )


def check_target_range(recipe: Recipe) -> None:
    """Refuse a target outside the range the training backend declares for its metric."""
    problem = target_range_problem(recipe)
    if problem:
        raise RecipeError(problem)
