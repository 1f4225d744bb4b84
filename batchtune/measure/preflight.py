"""Checks that need the backends, run before the first run (and by `batchtune recipes validate`).

recipe/ checks what the values alone say (types, ranges, cross-field rules). Here: what only the
backend that will run them can say: that the task exists and can be built (the prompts file opens,
the reward function imports, which runs the user's module: a recipe is code), and that the command's
placeholders are known and its program exists, and that the target lies inside the range the
backend declares for its metric. Every problem is reported at once, as a RecipeError,
so nothing is written and no run is sealed as failed for a mistake in the recipe.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from batchtune.errors import BatchtuneError, RecipeError
from batchtune.measure.guards import target_range_problem
from batchtune.recipe.schema import Recipe

MAX_ARITHMETIC_DIGITS = 3  # the arithmetic task enumerates all 10**(2d) problems


def problems(recipe: Recipe) -> list[str]:
    """Every problem the backend of ``recipe`` would meet before training, one message each: a
    target outside its metric's declared range too (guards.target_range_problem)."""
    training = recipe.backend.training
    found = []
    if training in ("torch", "trl"):
        found = _task_problems(recipe)
    elif training == "command":
        found = _command_problems(recipe)
    unreachable = target_range_problem(recipe)
    return found + _offpolicy_problems(recipe) + ([unreachable] if unreachable else [])


def check(recipe: Recipe) -> None:
    """Raise one RecipeError naming every problem (see ``problems``)."""
    found = problems(recipe)
    if found:
        where = f" in {recipe.source}" if recipe.source else ""
        raise RecipeError(f"{len(found)} problem(s){where}: " + "; ".join(found))


# the backends whose runs take staleness k and updates per batch u (backends/torch_rl, backends/nqm.py);
# the others would run every off-policy candidate on-policy under its -k{k}u{u} label
OFFPOLICY_BACKENDS = ("torch", "nqm")
SYNC_ONLY_BACKENDS = ("trl", "pretrain")  # in-process trainers with no rollout worker of their own


def _offpolicy_problems(recipe: Recipe) -> list[str]:
    """Off-policy knobs the training backend cannot honour: k and u where its runs never see them,
    algorithm.mode = "async" for a trainer that only runs in turn, and the async trainer's
    sync_every > k + 1 at an off-policy k the probe runs (k = 0 syncs every step), which fails every
    such run at its start (backends/torch_rl/async_run.check_async) after the probe has begun."""
    p, a, training = recipe.probe, recipe.algorithm, recipe.backend.training
    errors = []
    if training not in OFFPOLICY_BACKENDS:
        asked = [
            name
            for name, on in (
                ("probe.staleness", any(k > 0 for k in p.staleness)),
                ("probe.updates_per_batch", any(u != a.mini_batches for u in p.updates_per_batch)),
                ("probe.async_sweep", bool(p.async_sweep)),
            )
            if on
        ]
        if asked:
            errors.append(
                f"{', '.join(asked)}: the {training} backend runs on-policy only (its runs never see k "
                "or u), so these candidates would be on-policy runs under off-policy labels; drop them "
                "(runs you have at a staleness: batchtune import-logs --staleness K)"
            )
    if training in SYNC_ONLY_BACKENDS and a.mode == "async":
        errors.append(f"algorithm.mode: the {training} backend trains in turn only; set mode = 'sync'")
    low = sorted(k for k in p.staleness if 1 <= k < a.sync_every - 1)  # k = 0 syncs every step
    if training == "torch" and a.mode == "async" and low:
        errors.append(
            f"algorithm.sync_every = {a.sync_every}: the async trainer needs staleness >= sync_every - 1 "
            f"off-policy, and probe.staleness has k = {', '.join(map(str, low))}; drop them or lower "
            "sync_every"
        )
    return errors


def _task_problems(recipe: Recipe) -> list[str]:
    from batchtune.backends.torch_rl.tasks import BUILTIN_TASKS, import_reward, make_task

    task = recipe.task
    if task.name not in (*BUILTIN_TASKS, "jsonl"):
        return [f"task.name: unknown task {task.name!r}; choose one of {', '.join(BUILTIN_TASKS)} or 'jsonl'"]
    if task.name == "arithmetic" and task.difficulty > MAX_ARITHMETIC_DIGITS:
        return [
            f"task.difficulty: arithmetic takes 1 to {MAX_ARITHMETIC_DIGITS} digits, got {task.difficulty}"
        ]
    if task.name == "jsonl" and task.prompts_file and not Path(task.prompts_file).is_file():
        errors = [f"task.prompts_file: {task.prompts_file} is not a readable file"]
        if task.reward:
            try:
                import_reward(task.reward)
            except BatchtuneError as exc:
                errors.append(str(exc))
        return errors
    try:
        make_task(task)  # reads the prompts file and imports the reward function
    except BatchtuneError as exc:
        return [str(exc)]
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return [f"task.prompts_file: {task.prompts_file}: {exc}"]
    return []


def _command_problems(recipe: Recipe) -> list[str]:
    from batchtune.backends.command_args import argv_templates, fill, placeholders
    from batchtune.backends.spec import Candidate, RunFailed, RunSpec

    cfg = recipe.backend
    errors: list[str] = []
    if not cfg.command_log:
        errors.append("backend.command_log: say which file the command writes its metrics to")
    p, g = recipe.candidates.prompts[0], recipe.candidates.group_size
    spec = RunSpec(
        "preflight", Candidate(f"P{p}xG{g}", p, g, recipe.optimizer.lr, "none"), 0, recipe,
        Path(recipe.run.results_dir) / "runs" / "preflight", recipe.optimizer.lr, p * g,
    )  # fmt: skip
    values = placeholders(spec)
    templates = argv_templates(cfg, save=True, resume=True)
    templates += [(f"backend.command_env.{k}", v) for k, v in cfg.command_env.items()]
    templates += [("backend.command_log", cfg.command_log)]
    if cfg.checkpoint_path:
        templates += [("backend.checkpoint_path", cfg.checkpoint_path)]
    at_step = {**values, "step": 1, "samples": p * g}  # checkpoint_path's own placeholders
    for where, template in templates:
        try:
            text = fill(template, at_step if where == "backend.checkpoint_path" else values, where)
        except RecipeError as exc:
            errors.append(str(exc))
            continue
        except RunFailed:  # a placeholder that is not whole for this candidate: decided per run
            continue
        if len(text) > 1 << 16:
            errors.append(f"{where}: fills to {len(text)} characters; check its format spec")
    if cfg.command and shutil.which(cfg.command[0]) is None and "{" not in cfg.command[0]:
        errors.append(f"backend.command[0]: {cfg.command[0]!r} is not found or not executable")
    return errors
