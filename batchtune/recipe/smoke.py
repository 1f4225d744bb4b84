"""Smoke mode: the user's recipe at its smallest sizes, to prove in seconds that the recipe, task,
reward, trainer command and log reader work end to end before a real probe is paid for.

`smoke_recipe` shrinks every size (never the code path): one seed and no extra ones, the two
smallest batches, two optimiser steps of the larger, the tiniest model shape the recipe allows, two
concurrencies, one repeat, one generation mode, the least k > 0 of an off-policy sweep (no seed
top-up). An async torch-backend recipe's probe runs in one process, and its two-process path in
one run of the smallest batch (``SmokePlan.two_process``); another backend's runs as it runs them.
A command-backend recipe runs the user's own command, with those fewest steps. It also says,
truthfully, what this smoke cannot check here:

- a generation engine that is not installed is replaced by the simulated one (computed, not
  measured: no model loaded, nothing decoded);
- a recipe with ``generation.random_weights`` has no trained weights to train (a profile recipe):
  its probe is skipped;
- a command-backend recipe whose ``[model]`` is still the built-in default names its real model in
  the command, which batchtune never loads: profiling the toy would check nothing of the user's, so
  profile-gen is skipped.
"""

from __future__ import annotations

import dataclasses
import importlib.util

from batchtune.errors import RecipeError
from batchtune.recipe.schema import GenerationConfig, ModelConfig, ProbeConfig, Recipe

TINY_MODEL = {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2}
SMOKE_STEPS = 2  # optimiser steps of the larger batch


@dataclasses.dataclass(frozen=True)
class SmokePlan:
    """The shrunk recipe, and what smoke says about it: ``reduced`` (checked at smoke size only),
    ``unchecked`` (not checked here at all), ``skip`` (stage -> why that stage does not run)."""

    recipe: Recipe
    reduced: tuple[str, ...]
    unchecked: tuple[str, ...]
    skip: dict[str, str]
    # a branched recipe's checkpoint path at its smallest: a one-step trunk of the smallest batch
    # saving its checkpoint, and one step of every batch resumed from it (workflow/smoke.py)
    branches: Recipe | None = None
    # an async recipe's two-process path: its probe runs in one process (every async run starts a
    # rollout process that imports torch and transformers again), then one run of the smallest
    # batch as the recipe runs it, in two (workflow/smoke.py)
    two_process: Recipe | None = None


def smoke_recipe(cfg: Recipe, results_dir: str) -> SmokePlan:
    """The smallest run of ``cfg`` that still exercises every stage; see the module docstring. A
    branched recipe's probe stage runs the grid's two batches (its trainer, task, logs and ranking),
    and a stage of its own the checkpoint path (``SmokePlan.branches``): a trunk that saves, and
    branches that resume from it."""
    pretrain = cfg.study.pretrain
    plan = _pretrain_plan(cfg, results_dir) if pretrain else _rl_plan(cfg, results_dir)
    if not cfg.study.branched:
        return plan
    r = dataclasses.replace
    grid = r(plan.recipe, probe=r(plan.recipe.probe, mode="grid"))
    small = plan.recipe
    batches = (
        sorted(set(small.pretrain.batches_tokens))
        if pretrain
        else [p * small.candidates.group_size for p in sorted(set(small.candidates.prompts))]
    )
    b0, top = batches[0], batches[-1]
    branches = small  # workflow/smoke._smoke_branches runs its trunk and one step of each batch
    if pretrain:  # room for a step of the largest batch after the trunk's, an evaluation each step
        branches = r(small, pretrain=r(small.pretrain, max_tokens=b0 + top, eval_every_tokens=b0))
    reduced = (
        f"branches: a trunk of one step at {b0} saving its checkpoint, and from it one step of each of "
        f"{', '.join(map(str, batches))} (too short to read a ratio: the stage checks that they resume)"
    )
    unchecked = (
        "branches: that a branch continues the trunk's weights rather than starting over (a trainer "
        "that accepts its resume arguments and ignores them passes this smoke); a branch that "
        "logs the checkpoint's LR instead of its own does fail it"
    )
    return r(
        plan,
        recipe=grid,
        reduced=(*plan.reduced, reduced),
        unchecked=(*plan.unchecked, unchecked),
        branches=branches,
    )


def _smoke_generation(
    cfg: Recipe,
    named_model: bool,
    model_name: str,
    skip: dict[str, str],
    reduced: list[str],
    unchecked: list[str],
) -> GenerationConfig:
    """The generation settings at smoke size; what is skipped, reduced or left unchecked is appended."""
    r = dataclasses.replace
    training = cfg.backend.training
    g = cfg.generation
    backend = g.backend
    if backend == "vllm" and importlib.util.find_spec("vllm") is None:
        backend = "simulated"
        unchecked.append(
            "generation: vLLM is not installed, so the simulated engine stood in (computed, not "
            "measured: no model loaded, nothing decoded)"
        )
    if g.random_weights and training not in ("nqm", "command"):
        skip["probe"] = (
            "generation.random_weights: the model has no trained weights to train (a profile recipe; "
            "run `batchtune profile-gen`)"
        )
    if named_model and ("probe" not in skip or backend != "simulated"):
        reduced.append(f"model: {model_name} at its full size (a named model has one shape)")
    gen = r(
        g,
        backend=backend,
        concurrency=sorted(set(g.concurrency))[:2],
        train_batches=sorted(set(g.train_batches))[:2],
        modes=g.modes[:1],
        repeats=1,
        warmup=0,
        max_new_tokens=min(g.max_new_tokens, 8),
        retime_contended=0,  # a smoke checks that profiling works, not how fast: no re-timing
    )
    if "profile-gen" not in skip:
        reduced.append(f"profile: concurrency {gen.concurrency}, mode {gen.modes[0]}, one repeat, no warmup")
    return gen


def _rl_plan(cfg: Recipe, results_dir: str) -> SmokePlan:
    r = dataclasses.replace
    c, b = cfg.candidates, cfg.budget
    prompts = sorted(set(c.prompts))[:2]
    if len(prompts) < 2:
        raise RecipeError(f"{cfg.source}: smoke mode needs two candidate batches, the recipe has {prompts}")
    n_max = prompts[-1] * c.group_size
    reduced = [
        f"batches: {len(c.prompts)} -> 2 ({prompts[0] * c.group_size} and {n_max} responses)",
        f"seeds: {len(b.seeds)} -> 1 (seed {b.seeds[0]}), no extra seeds for undecided batches",
        f"samples per run: {b.max_samples} -> {SMOKE_STEPS * n_max} "
        f"({SMOKE_STEPS} steps of the larger batch)",
    ]
    unchecked: list[str] = []
    skip: dict[str, str] = {}
    if c.group_sweep_total or c.fixed_lr_prompts:
        reduced.append("group-size sweep and fixed-LR controls: skipped")
    model, task, training = cfg.model, cfg.task, cfg.backend.training
    named_model = False
    if training == "nqm":
        pass  # a simulation: no model
    elif training == "command":
        reduced.append(
            f"trainer command: run as written, for {SMOKE_STEPS} steps of the larger batch ({{max_steps}})"
        )
        if model == ModelConfig():
            skip["profile-gen"] = (
                "[model] is the built-in default while the trainer's model is named in its command, "
                "which batchtune never loads: set [model] name to profile your model"
            )
    elif model.name == "tiny-llama":
        model = r(model, **TINY_MODEL, pretrain_steps=min(model.pretrain_steps, 2))
        reduced.append("model: tiny-llama shrunk to hidden 16, 1 layer; warm start 2 steps")
    else:
        named_model = True
    task = r(
        task, train_size=min(task.train_size, 256), eval_size=min(task.eval_size, 8), eval_every_samples=0
    )
    gen = _smoke_generation(cfg, named_model, model.name, skip, reduced, unchecked)
    probe = _smoke_offpolicy(cfg, reduced)
    out = r(
        cfg,
        run=r(cfg.run, results_dir=results_dir, workers=1),
        model=model,
        task=task,
        candidates=r(c, prompts=prompts, group_sweep_total=0, group_sweep_sizes=[], fixed_lr_prompts=[]),
        budget=r(
            b,
            seeds=b.seeds[:1],
            max_samples=SMOKE_STEPS * n_max,
            stop_outside_band=False,
            max_extra_seeds=0,
            async_top_up_seeds=0,
        ),
        generation=gen,
        probe=probe,
    )
    if cfg.algorithm.mode != "async":
        return SmokePlan(out, tuple(reduced), tuple(unchecked), skip)
    if training != "torch":  # only the torch backend runs async as a rollout process beside the trainer
        reduced.append(
            f"algorithm.mode = async: the probe's runs as the {training} backend runs them (no two-process "
            "stage: a rollout process beside the trainer is the torch backend's async run)"
        )
        return SmokePlan(out, tuple(reduced), tuple(unchecked), skip)
    reduced.append(
        "algorithm.mode = async: the probe's runs in one process (mode = sync); one run of the smallest "
        "batch, at the least staleness k > 0, as a rollout process beside the trainer (stage two-process)"
    )
    one = r(out, algorithm=r(out.algorithm, mode="sync"))
    return SmokePlan(one, tuple(reduced), tuple(unchecked), skip, two_process=out)


def _smoke_offpolicy(cfg: Recipe, reduced: list[str]) -> ProbeConfig:
    """An off-policy sweep at one cell of each kind: on-policy, the least k > 0 at the least u (a u-only
    sweep: its next u), so the two-process and reuse paths run without every (k, u) cell of both batches."""
    p = cfg.probe
    ks, us = sorted(set(p.staleness)), sorted(set(p.updates_per_batch))
    keep_k = [k for k in ks if k == 0] + [k for k in ks if k > 0][:1]
    keep_u = us[: 1 if len(keep_k) > 1 or ks[0] > 0 else 2]
    if (keep_k, keep_u) == (ks, us):
        return p
    reduced.append(
        f"off-policy sweep: staleness {p.staleness} -> {keep_k}, updates per batch {p.updates_per_batch} -> "
        f"{keep_u}; no seed top-up"
    )
    return dataclasses.replace(p, staleness=keep_k, updates_per_batch=keep_u)


def _pretrain_plan(cfg: Recipe, results_dir: str) -> SmokePlan:
    """A pre-training recipe: the three smallest token batches (the fewest the grid analysis takes),
    one seed, two steps of the largest with an evaluation after each; no generation, no ranking."""
    r, p, b = dataclasses.replace, cfg.pretrain, cfg.budget
    batches = sorted(set(p.batches_tokens))[:3]
    max_tokens = SMOKE_STEPS * batches[-1]
    reduced = (
        f"token batches: {len(set(p.batches_tokens))} -> 3 ({', '.join(map(str, batches))})",
        f"seeds: {len(b.seeds)} -> 1 (seed {b.seeds[0]})",
        f"tokens per run: {p.max_tokens} -> {max_tokens} ({SMOKE_STEPS} steps of the largest batch), "
        f"evaluation every {batches[-1]} tokens on {min(p.eval_sequences, 8)} sequences, no warmup",
        f"model: the built-in pre-training Llama at size {p.size!r} (not shrunk)",
    )
    pretrain = r(
        p,
        batches_tokens=batches,
        max_tokens=max_tokens,
        eval_every_tokens=batches[-1],
        eval_sequences=min(p.eval_sequences, 8),
        warmup_tokens=0,
        micro_batch_tokens=0,
    )
    out = r(
        cfg,
        run=r(cfg.run, results_dir=results_dir, workers=1),
        budget=r(b, seeds=b.seeds[:1], max_extra_seeds=0),
        pretrain=pretrain,
    )
    ranked = (  # a branched recipe is ranked (`batchtune tune`), a grid is not: say which
        "pre-training, branched: the one-step trunk and branches reach no target, so there is no "
        "time-to-target to rank; `batchtune tune` ranks the full probe's"
        if cfg.study.branched
        else "pre-training: the probe's grid analysis (B_opt, B_min per target loss) is its answer"
    )
    skip = {
        "profile-gen": "pre-training generates nothing: no generation to profile",
        "recommend": ranked,
    }
    return SmokePlan(out, reduced, (), skip)
