"""The placeholders of a command run: the values its argv, log path, environment and checkpoint path
templates may use (listed in ``backends/command.py``'s docstring), and filling a template with them."""

from __future__ import annotations

import math
import re
import string
from typing import Any

from batchtune.backends.command_checkpoints import Origin, origin, trainer_step
from batchtune.backends.spec import RunFailed, RunSpec
from batchtune.errors import RecipeError


def placeholders(spec: RunSpec, start: Origin | None = None) -> dict[str, Any]:
    """The values the argv, log path and environment templates may use (``start``: the run's
    origin when the caller has read it already)."""
    c, r = spec.candidate, spec.recipe
    n = c.batch_responses
    mb = r.algorithm.mini_batches
    start = start or origin(spec)
    mode = r.backend.resume_steps
    max_steps = start.base_step(mode) + max(1, math.ceil((r.budget.max_samples - start.samples) / n))
    saves = [trainer_step(start, x, n, mode) for x in sorted(spec.save_at_samples) if x > start.samples]
    whole = [x for x in saves if x is not None]
    gpus = r.hardware.num_gpus
    output_dir = spec.run_dir / "output"
    values: dict[str, Any] = {
        "prompts": c.prompts,
        "group_size": c.group_size,
        "batch_responses": n,
        "batch_responses_per_gpu": n // gpus if n % gpus == 0 else None,
        "mini_batch_prompts": c.prompts // mb if c.prompts % mb == 0 else None,
        "mini_batch_responses": n // mb if n % mb == 0 else None,
        "lr": repr(float(c.lr)),
        "critic_lr": repr(float(c.critic_lr if c.critic_lr is not None else c.lr)),
        "seed": spec.seed,
        "max_samples": r.budget.max_samples,
        "max_steps": max_steps,
        "max_prompts": max_steps * c.prompts,
        "output_dir": str(output_dir),
        "run_dir": str(spec.run_dir),
        "run_id": spec.run_id,
        "num_gpus": gpus,
        "checkpoint_dir": str(spec.checkpoint_dir or spec.run_dir / "checkpoints"),
        "resume_from": start.path,
        "resume_step": start.step,
        # None (an error naming the placeholder, if used) when a save falls inside a step
        "save_at_steps": ",".join(map(str, whole)) if len(whole) == len(saves) else None,
        # trainers save when their own step count is a multiple of it (verl, TRL, OpenRLHF)
        "save_every_steps": math.gcd(*whole) if saves and len(whole) == len(saves) else None,
    }
    return values


def fill(template: str, values: dict[str, Any], where: str) -> str:
    """``template`` with placeholders filled; a clear error for unknown or inexpressible ones."""
    try:
        parsed = [(f, spec or "") for _, f, spec, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise RecipeError(f"{where}: {template!r}: {exc} (write {{{{ and }}}} for literal braces)") from None
    for name, spec in parsed:
        if any(len(w) > 3 for w in re.findall(r"\d+", spec)):  # {lr:>300000000} would fill gigabytes
            raise RecipeError(f"{where}: {{{name}:{spec}}}: a width or precision above 999")
        if name not in values:
            raise RecipeError(f"{where}: unknown placeholder {{{name}}}; known: {', '.join(sorted(values))}")
        if values[name] is None:
            raise RunFailed("failed", f"{where}: {{{name}}} is not a whole number for this candidate")
    return template.format(**values)


def argv_templates(cfg: Any, *, save: bool, resume: bool) -> list[tuple[str, str]]:
    """(recipe key, template) of each argv item: the command, then the save and resume args."""
    out = [(f"backend.command[{i}]", t) for i, t in enumerate(cfg.command)]
    if save:
        out += [(f"backend.command_save_args[{i}]", t) for i, t in enumerate(cfg.command_save_args)]
    if resume:
        out += [(f"backend.command_resume_args[{i}]", t) for i, t in enumerate(cfg.command_resume_args)]
    return out
