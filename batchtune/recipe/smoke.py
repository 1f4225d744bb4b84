"""Smoke mode: the user's recipe at its smallest sizes, to prove in seconds that the recipe, task,
reward, trainer command and log reader work end to end before a real probe is paid for.

`smoke_recipe` shrinks every size (never the code path): one seed, the two smallest batches, two
optimiser steps of the larger, the tiniest model shape the recipe allows, two concurrencies, one
repeat, one generation mode; a generation engine that is not installed is replaced by the simulated
one. It returns the shrunk recipe and one line per thing it reduced or skipped.
"""

from __future__ import annotations

import dataclasses
import importlib.util

from batchtune.errors import RecipeError
from batchtune.recipe.schema import Recipe

TINY_MODEL = {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2}
SMOKE_STEPS = 2  # optimiser steps of the larger batch


def smoke_recipe(cfg: Recipe, results_dir: str) -> tuple[Recipe, list[str]]:
    """The smallest run of ``cfg`` that still exercises every stage; see the module docstring."""
    r = dataclasses.replace
    c = cfg.candidates
    prompts = sorted(set(c.prompts))[:2]
    if len(prompts) < 2:
        raise RecipeError(f"{cfg.source}: smoke mode needs two candidate batches, the recipe has {prompts}")
    n_max = prompts[-1] * c.group_size
    skipped = [
        f"batches: {len(c.prompts)} -> 2 ({prompts[0] * c.group_size} and {n_max} responses)",
        f"seeds: {len(cfg.budget.seeds)} -> 1 (seed {cfg.budget.seeds[0]})",
        f"samples per run: {cfg.budget.max_samples} -> {SMOKE_STEPS * n_max} "
        f"({SMOKE_STEPS} steps of the larger batch)",
    ]
    if c.group_sweep_total or c.fixed_lr_prompts:
        skipped.append("group-size sweep and fixed-LR controls: skipped")
    model, task = cfg.model, cfg.task
    if cfg.backend.training == "nqm":
        pass  # a simulation: no model
    elif model.name == "tiny-llama":
        model = r(model, **TINY_MODEL, pretrain_steps=min(model.pretrain_steps, 2))
        skipped.append("model: tiny-llama shrunk to hidden 16, 1 layer; warm start 2 steps")
    else:
        skipped.append(f"model: {model.name} kept (a named model has one shape)")
    task = r(
        task, train_size=min(task.train_size, 256), eval_size=min(task.eval_size, 8), eval_every_samples=0
    )
    g = cfg.generation
    backend = g.backend
    if backend == "vllm" and importlib.util.find_spec("vllm") is None:
        backend = "simulated"
        skipped.append("generation: vLLM not installed, simulated engine used (no real decode timed)")
    gen = r(
        g,
        backend=backend,
        concurrency=sorted(set(g.concurrency))[:2],
        train_batches=sorted(set(g.train_batches))[:2],
        modes=g.modes[:1],
        repeats=1,
        warmup=0,
        max_new_tokens=min(g.max_new_tokens, 8),
    )
    skipped.append(f"profile: concurrency {gen.concurrency}, mode {gen.modes[0]}, one repeat, no warmup")
    out = r(
        cfg,
        run=r(cfg.run, results_dir=results_dir, workers=1),
        model=model,
        task=task,
        candidates=r(c, prompts=prompts, group_sweep_total=0, group_sweep_sizes=[], fixed_lr_prompts=[]),
        budget=r(
            cfg.budget, seeds=cfg.budget.seeds[:1], max_samples=SMOKE_STEPS * n_max, stop_outside_band=False
        ),
        generation=gen,
    )
    return out, skipped
