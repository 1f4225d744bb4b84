"""Checks across recipe values that types alone cannot express (positive sizes, divisibility, rules
that fit the algorithm). Every problem is returned, so they are reported together.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchtune.recipe.schema import Recipe


def _check_batches_and_algorithm(recipe: Recipe) -> list[str]:
    """The candidate batches, the algorithm's batching and the probe's async sweep."""
    errors: list[str] = []
    c = recipe.candidates
    if not c.prompts or any(p <= 0 for p in c.prompts):
        errors.append("candidates.prompts: needs at least one positive number of prompts")
    if c.group_size <= 0:
        errors.append("candidates.group_size: must be positive")
    if recipe.algorithm.name == "grpo" and c.group_size < 2:
        errors.append("candidates.group_size: GRPO needs at least 2 responses per prompt")
    min_g = 2 if recipe.algorithm.name == "grpo" else 1
    if any(g < min_g for g in c.group_sweep_sizes):
        errors.append(f"candidates.group_sweep_sizes: each must be at least {min_g}")
    elif c.group_sweep_total < 0 or (
        c.group_sweep_total and any(c.group_sweep_total % g for g in c.group_sweep_sizes)
    ):
        errors.append("candidates.group_sweep_sizes: each must divide group_sweep_total")
    if (
        recipe.algorithm.name == "ppo"
        and not recipe.algorithm.critic_lr_rule
        and recipe.lr_scaling.rule == "table"
    ):
        errors.append("algorithm.critic_lr_rule: the actor's LR table does not apply to the critic; set one")
    if any(p <= 0 for p in c.fixed_lr_prompts):
        errors.append("candidates.fixed_lr_prompts: must be positive numbers of prompts")
    if recipe.generation.temperature <= 0:
        errors.append("generation.temperature: must be positive (RL needs sampled responses)")
    if recipe.algorithm.mini_batches < 1:
        errors.append("algorithm.mini_batches: must be at least 1")
    m = recipe.algorithm.mini_batches
    if m >= 1 and any(u % m for u in recipe.probe.updates_per_batch):
        errors.append(f"probe.updates_per_batch: each must be a multiple of algorithm.mini_batches = {m}")
    if not recipe.probe.staleness:
        errors.append("probe.staleness: needs at least one value (0 = on-policy)")
    if recipe.probe.async_sweep and (recipe.probe.staleness != [0] or recipe.probe.updates_per_batch):
        errors.append(
            "probe.async_sweep = 'auto' chooses k and u itself: drop probe.staleness and updates_per_batch"
        )
    if recipe.algorithm.micro_batch_responses < 0:
        errors.append("algorithm.micro_batch_responses: must be 0 (no accumulation) or more")
    return errors


def check_recipe(recipe: Recipe) -> list[str]:
    """Every problem with the values of a well-typed recipe, as one message each."""
    errors = _check_batches_and_algorithm(recipe)
    if recipe.optimizer.lr <= 0:
        errors.append("optimizer.lr: must be positive")
    if recipe.target.tolerance <= 0:
        errors.append("target.tolerance: must be positive (about 0.1)")
    if not 0 < recipe.target.confidence < 1:
        errors.append("target.confidence: must lie between 0 and 1")
    if not recipe.budget.seeds:
        errors.append("budget.seeds: needs at least one seed")
    elif len(set(recipe.budget.seeds)) < len(recipe.budget.seeds):
        dup = sorted({s for s in recipe.budget.seeds if recipe.budget.seeds.count(s) > 1})
        errors.append(f"budget.seeds: {dup} repeated: a seed reruns the same run, give distinct seeds")
    if recipe.budget.max_extra_seeds < 0:
        errors.append("budget.max_extra_seeds: must be >= 0 (0 = no sequential seeding)")
    if recipe.budget.max_samples <= 0:
        errors.append("budget.max_samples: must be positive")
    if recipe.run.workers < 1:
        errors.append("run.workers: must be at least 1")
    if recipe.run.ray_num_cpus < 0 or recipe.run.ray_max_retries < 0:
        errors.append("run.ray_num_cpus and run.ray_max_retries: must be 0 or more")
    if recipe.run.ray_num_gpus < 0 and recipe.run.ray_num_gpus != -1:
        errors.append("run.ray_num_gpus: must be 0 or more (or -1: from hardware.num_gpus on CUDA)")
    g = recipe.generation
    if not g.concurrency or any(x <= 0 for x in g.concurrency):
        errors.append("generation.concurrency: needs positive concurrencies")
    if any(m not in ("fixed", "eos") for m in g.modes):
        errors.append("generation.modes: each must be 'fixed' or 'eos'")
    if not 0 < g.gpu_memory_utilization <= 1:
        errors.append("generation.gpu_memory_utilization: must lie in (0, 1]")
    if not 0 <= g.eos_stop_prob < 1:
        errors.append("generation.eos_stop_prob: must lie in [0, 1) (0 = the model's own EOS)")
    if g.prompt_tokens < 1 or g.max_new_tokens < 1:
        errors.append("generation.prompt_tokens and max_new_tokens: must be at least 1")
    if g.repeats < 1 or g.warmup < 0:
        errors.append("generation.repeats: must be at least 1 (and warmup at least 0)")
    if recipe.lr_scaling.rule == "table" and not recipe.lr_scaling.table:
        errors.append("lr_scaling.table: rule 'table' needs {\"N\" = lr, ...} entries")
    if recipe.backend.training == "command" and not recipe.backend.command:
        errors.append("backend.command: the command backend needs an argv list")
    if recipe.study.pretrain:
        errors.extend(_check_pretrain(recipe))
    errors.extend(_check_model_and_task(recipe))
    if recipe.task.reward:
        errors.extend(reward_problems(recipe.task.reward))
    if not recipe.run.results_dir.strip():
        errors.append("run.results_dir: must name a directory (empty would write into the current one)")
    return errors


def _check_pretrain_branches(recipe: Recipe) -> list[str]:
    """A branched probe of a pre-training recipe compares eval losses against its lowest target and
    runs every trunk and branch inside pretrain.max_tokens (the schedule's horizon): a branch cut
    there would read as one that never kept up."""
    p, b = recipe.pretrain, recipe.branch
    if not p.targets:
        return ["pretrain.targets: a branched probe needs a target loss (it reads the critical batch there)"]
    if not p.batches_tokens:  # said by the batches' own check
        return []
    top = max(p.batches_tokens)
    longest = b.trunk_samples + b.max_window_factor * max(b.window_samples, b.min_steps * top) + top
    if p.max_tokens < longest:
        return [
            f"pretrain.max_tokens: {p.max_tokens:,} is short of the trunk ({b.trunk_samples:,}) and the "
            f"longest branch after it ({longest - b.trunk_samples:,.0f} tokens at {top}): at least "
            f"{math.ceil(longest):,}"
        ]
    return []


def _check_model_and_task(recipe: Recipe) -> list[str]:
    """Shapes a built-in model can have, and a held-out metric only where a held-out set exists."""
    m, errors = recipe.model, []
    if m.name == "tiny-llama":
        if m.hidden_size % m.num_heads:
            errors.append(f"model.hidden_size: {m.hidden_size} is not divisible by num_heads = {m.num_heads}")
        if m.num_heads % m.num_kv_heads:
            errors.append(f"model.num_kv_heads: {m.num_kv_heads} does not divide num_heads = {m.num_heads}")
        if recipe.generation.max_new_tokens >= m.max_position_embeddings:
            errors.append(
                f"generation.max_new_tokens: {recipe.generation.max_new_tokens} leaves no room for the "
                f"prompt in model.max_position_embeddings = {m.max_position_embeddings}"
            )
    if (
        recipe.backend.training in ("torch", "trl")
        and recipe.task.eval_size == 0
        and recipe.target.metric.startswith("eval_")
    ):
        errors.append(
            f"task.eval_size: 0 means no held-out set, so target.metric = {recipe.target.metric!r} is never "
            "logged; set eval_size or target the training metric (target.metric = 'reward')"
        )
    return errors


def _check_pretrain(recipe: Recipe) -> list[str]:
    p, errors = recipe.pretrain, []
    if p.seq_len < 2:
        errors.append("pretrain.seq_len: must be at least 2")
    off = sorted({b for b in p.batches_tokens if b < p.seq_len or b % p.seq_len})
    if len(set(p.batches_tokens)) < 3 or off:
        n = len(set(p.batches_tokens))
        why = f"{', '.join(map(str, off))} not a multiple of" if off else f"{n} given;"
        errors.append(
            f"pretrain.batches_tokens: needs >= 3 distinct batches, each a multiple of seq_len ({why} "
            f"seq_len = {p.seq_len})"
        )
    if p.micro_batch_tokens and (p.micro_batch_tokens < p.seq_len or p.micro_batch_tokens % p.seq_len):
        errors.append("pretrain.micro_batch_tokens: 0, or a multiple of seq_len")
    if p.max_tokens <= max(p.batches_tokens or [0]):
        errors.append(
            f"pretrain.max_tokens: {p.max_tokens} must exceed the largest batch, {max(p.batches_tokens)} "
            "tokens (a run of one step measures nothing); raise it or drop that batch"
        )
    if p.warmup_tokens >= p.max_tokens > 0:
        errors.append(
            f"pretrain.warmup_tokens: {p.warmup_tokens} must be below max_tokens, {p.max_tokens} (every "
            "run would end inside its warmup, before its LR reaches the candidate's); lower it or raise "
            "max_tokens"
        )
    if p.eval_every_tokens <= 0 or p.eval_sequences < 1:
        errors.append("pretrain.eval_every_tokens, eval_sequences: must be > 0")
    if any(t <= 0 for t in p.targets):
        errors.append("pretrain.targets: losses in nats/token, each > 0")
    if not 0 <= p.decay_fraction < 1 or p.warmup_tokens < 0:
        errors.append("pretrain.decay_fraction: must lie in [0, 1) (and warmup_tokens >= 0)")
    if p.data == "files" and not p.files:
        errors.append("pretrain.files: data = 'files' needs .txt or .jsonl paths")
    if p.data == "markov" and not (
        2 <= p.markov_branching <= p.markov_vocab and 1 <= p.markov_order <= 3 and p.markov_concentration > 0
    ):
        errors.append("pretrain.markov_*: needs 2 <= branching <= vocab, order 1..3, concentration > 0")
    if recipe.study.branched:
        errors.extend(_check_pretrain_branches(recipe))
    return errors


def reward_problems(spec: str) -> list[str]:
    """task.reward names the user's own function, imported as ``module:function`` and called as
    f(prompt, response, answer). A standard-library or builtin module (``os:system``,
    ``subprocess:call``) or a private name is refused: such a name would run commands, not score."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        return []  # said, with an example, where the reward is imported
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names or top == "builtins":
        return [
            f"task.reward: {spec!r} names the standard-library module {top!r}; a reward must be your own "
            "function (module:function in your code, on PYTHONPATH), since a library function such as "
            "os:system would be called with the responses as arguments"
        ]
    names = [attr, *module.split(".")]
    if attr.startswith("_") or not all(n.isidentifier() for n in names):
        return [f"task.reward: {spec!r}: the module and function must be public Python names (no leading _)"]
    return []


def another_recipe(manifest: dict[str, Any] | None, recipe: Recipe, root: object) -> str | None:
    """Why a results directory's runs belong to another recipe than ``recipe`` (its manifest's target
    metric or training backend differ), as a message naming that recipe; None when they agree."""
    stored = manifest.get("recipe") if isinstance(manifest, dict) else None
    if not isinstance(stored, dict):
        return None
    target, backend = stored.get("target") or {}, stored.get("backend") or {}
    theirs = (target.get("metric"), backend.get("training"))
    if theirs == (recipe.target.metric, recipe.backend.training) or not isinstance(theirs[0], str):
        return None
    source = str(manifest.get("source") or "another recipe") if manifest else "another recipe"
    return (
        f"{root} holds the runs of another recipe ({source}: target {theirs[0]!r}, backend "
        f"{theirs[1]!r}), not of {recipe.source or 'the default recipe'} (target "
        f"{recipe.target.metric!r}): give that recipe, e.g. batchtune recommend {source} --results {root}"
    )
