"""Writing the winner in a trainer's own units: the shared input and output, the divisibility helpers,
and one entry point over the per-trainer emitters (verl.py, trl.py, openrlhf.py).

    emit("verl", RecommendationInput(prompts=128, group_size=8, lr=1.4e-6), num_gpus=8)

Each emitter checks the trainer's divisibility rules for the GPU count and raises InputError naming
the rule and the nearest valid setting when the winner cannot be expressed exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from batchtune.analysis.decide.async_rank import AsyncPick, queue_cap
from batchtune.analysis.decide.recommend import Recommendation
from batchtune.errors import InputError
from batchtune.integrations.emit_base import TRAINERS, EmittedConfig, RecommendationInput
from batchtune.integrations.emit_files import sig3
from batchtune.integrations.openrlhf import emit_openrlhf
from batchtune.integrations.trl import emit_trl
from batchtune.integrations.verl import emit_verl
from batchtune.recipe.schema import Recipe
from batchtune.records.types import OFFPOLICY_SUFFIX

__all__ = ["TRAINERS", "EmittedConfig", "RecommendationInput", "emit", "emit_for_recommendation"]


def emit(trainer: str, rec: RecommendationInput, num_gpus: int, **options: Any) -> EmittedConfig:
    """``options``: verl and openrlhf ``gpus_per_node``; openrlhf ``legacy_flags`` (names before
    0.10.2). TRL has no node layout here (accelerate's num_processes is the GPU count)."""
    if trainer == "trl":
        options.pop("gpus_per_node", None)
    emitters = {"verl": emit_verl, "trl": emit_trl, "openrlhf": emit_openrlhf}
    if trainer not in emitters:
        raise InputError(f"unknown trainer {trainer!r}; choose one of {', '.join(TRAINERS)}")
    # LRs to 3 significant digits: the probe cannot resolve more, and the text must paste cleanly
    rec = dataclasses.replace(rec, lr=sig3(rec.lr), critic_lr=sig3(rec.critic_lr))
    return emitters[trainer](rec, num_gpus, **options)


def recommendation_input(
    rec: Recommendation, cfg: Recipe | None = None, num_gpus: int = 0
) -> RecommendationInput:
    """The winner of a recommendation as emitter input. The winner carries its own LR and (PPO) the
    critic LR its runs used (Hilton et al. 2021: the critic has its own scale); the recipe, when
    known, supplies the algorithm, the mini-batches and vLLM's memory share; the generation
    concurrency comes from a measured profile."""
    w = rec.winner
    concurrency = rec.winner_throughput.generation_concurrency or 0
    if cfg is None:
        base = RecommendationInput(
            w.prompts, w.group_size, w.lr, critic_lr=w.critic_lr or 0.0, generation_concurrency=concurrency
        )
        return _with_async(base, rec, None, num_gpus)
    return _with_async(
        RecommendationInput(
            prompts=w.prompts,
            group_size=w.group_size,
            lr=w.lr,
            algorithm=cfg.algorithm.name,
            mini_batches=cfg.algorithm.mini_batches,
            critic_lr=(w.critic_lr or 0.0) if cfg.algorithm.name == "ppo" else 0.0,
            generation_concurrency=concurrency,
            gpu_memory_utilization=(
                cfg.generation.gpu_memory_utilization if cfg.generation.backend == "vllm" else 0.0
            ),
        ),
        rec,
        cfg,
        num_gpus,
    )




def pick_offpolicy(rec: Recommendation) -> tuple[int, int]:
    """(staleness k, updates per batch u; 0 = the recipe's mini-batches) of the winner: the async
    ranking's pick when there is one (``rec.async_choice``), else the winner's ``-k{k}u{u}`` label,
    else on-policy, at the u its runs were imported at (``rec.logged_updates``; 0 for a probe's)."""
    choice = getattr(rec, "async_choice", None)
    if choice is not None:
        return int(choice.staleness), int(choice.updates_per_batch)
    m = OFFPOLICY_SUFFIX.search(rec.winner.label)
    return (int(m.group(1)), int(m.group(2))) if m else (0, int(getattr(rec, "logged_updates", 0)))


def logged_split_note(rec: Recommendation, spec: RecommendationInput) -> str:
    """Where the winner's runs were imported at u > 1, what the emitted split of u assumed: a log gives
    the product u = mini-batches x epochs (import-logs --updates-per-batch), not the split."""
    if getattr(rec, "logged_updates", 0) <= 1:
        return ""
    m, e, u = spec.mini_batches, spec.epochs, spec.updates_per_batch
    return (
        f"the imported runs trained at u = {u} updates per rollout batch "
        "(import-logs --updates-per-batch); a log gives only that product of mini-batches x epochs, "
        f"not its split, so this config assumes {m} mini-batch{'es' if m > 1 else ''} x {e} "
        f"epoch{'s' if e > 1 else ''}: set the split the runs used, keeping the product {u}"
    )


def _split(choice: Any, num_gpus: int) -> tuple[int, str]:
    """The pick's rollout GPUs for ``num_gpus`` (0: none ranked), scaled when the ranking assumed
    another GPU count; and the note that says so."""
    rollout, total = getattr(choice, "rollout_gpus", None) or 0, getattr(choice, "total_gpus", 0) or 0
    if not rollout or not num_gpus or not total or total == num_gpus or num_gpus < 2:
        return rollout, ""
    scaled = min(max(1, round(rollout * num_gpus / total)), num_gpus - 1)
    note = (
        f"the ranking split {total} GPUs {rollout}:{total - rollout} (rollout:train); scaled to "
        f"{scaled}:{num_gpus - scaled} for {num_gpus} GPUs"
    )
    return scaled, note


def _with_async(
    base: RecommendationInput, rec: Recommendation, cfg: Recipe | None, num_gpus: int = 0
) -> RecommendationInput:
    """The off-policy part of the pick: k, u, mode, sync_every, in-flight cap and split from the async
    ranking's pick (``rec.async_choice``) when there is one, else k and u from the winner's label and
    the rest from the recipe's [algorithm]."""
    k, u = pick_offpolicy(rec)
    choice = getattr(rec, "async_choice", None)
    # the pick's own mini-batches; else the recipe's, or without one its default 1 (u then counts epochs)
    mini = int(getattr(choice, "mini_batches", 0) or base.mini_batches)
    if u and u % mini:
        raise InputError(f"the pick's updates_per_batch={u} is not a multiple of mini_batches={mini}")
    alg = cfg.algorithm if cfg is not None else None
    mode = getattr(choice, "mode", None) or (alg.mode if alg is not None else "sync")
    cap = getattr(choice, "in_flight_cap", None)
    sync_every = getattr(choice, "sync_every", None) or (alg.sync_every if alg is not None else 1)
    rollout, split_from = _split(choice, num_gpus)
    return dataclasses.replace(
        base,
        mini_batches=mini,
        epochs=(u // mini) if u else 1,
        staleness=k,
        mode=mode,
        sync_every=sync_every,
        in_flight_cap=cap if cap is not None else (alg.in_flight_cap if alg is not None else 0),
        rollout_gpus=rollout if mode == "async" else 0,
        split_from=split_from,
    )


def emit_for_recommendation(
    rec: Recommendation, trainer: str, num_gpus: int, cfg: Recipe | None = None, **options: Any
) -> EmittedConfig:
    """``emit`` for a Recommendation (what `batchtune recommend --emit` prints). The pick's split is
    the model's best for ``num_gpus``, which knows nothing of the trainer's rules: when the trainer
    cannot take it (the batch does not divide over the training GPUs, a side that does not fill
    whole nodes), the winner's next modelled split that it takes is emitted, with a note saying so, and
    the result's ``pick`` is the async pick at that split (the note its ``split_note``), so that what
    `recommend` says to run (``run_as``, the "Run it" line) names the split written. Where the
    winner's runs were imported from logs at u > 1, a note says how u was split (logged_split_note)."""
    spec = recommendation_input(rec, cfg, num_gpus)
    out = _emit_at_a_split(rec, trainer, num_gpus, spec, **options)
    note = logged_split_note(rec, spec)
    return dataclasses.replace(out, text=out.text + f"# {note}\n", notes=(*out.notes, note)) if note else out


def _emit_at_a_split(
    rec: Recommendation, trainer: str, num_gpus: int, spec: RecommendationInput, **options: Any
) -> EmittedConfig:
    """``emit`` of ``spec``, else at the winner's next modelled split the trainer takes (above)."""
    try:
        return emit(trainer, spec, num_gpus, **options)
    except InputError as exc:
        rows = _other_splits(rec, spec, num_gpus)
        if not rows:
            raise
        first = f"{spec.rollout_gpus}:{num_gpus - spec.rollout_gpus}"
        others = set()
        for ch in rows:
            alt = dataclasses.replace(
                spec, rollout_gpus=ch.rollout_gpus, in_flight_cap=queue_cap(ch.in_flight_cap)
            )
            try:
                out = emit(trainer, alt, num_gpus, **options)
            except InputError as err:
                others.add(str(err))
                continue
            note = (
                f"the modelled best split {first} (rollout:train) cannot be emitted for {trainer} ({exc}); "
                f"emitted {trainer}'s best modelled split that fits, {ch.rollout_gpus}:"
                f"{num_gpus - ch.rollout_gpus} (the GPU split table's row)"
            )
            pick = _pick_at(rec, ch, num_gpus, note)
            text = out.text + f"# {note}\n"
            return dataclasses.replace(out, text=text, notes=(*out.notes, note), pick=pick)
        if str(exc) in others:  # another split fails the same way: not the split's fault, said as is
            raise
        tried = ", ".join([first] + [f"{c.rollout_gpus}:{num_gpus - c.rollout_gpus}" for c in rows])
        raise InputError(
            f"{exc}; no rollout:train split of {num_gpus} GPUs modelled for {rec.winner.label} fits "
            f"{trainer} (tried {tried}): give another --gpus"
        ) from None


def _other_splits(rec: Recommendation, spec: RecommendationInput, num_gpus: int) -> list[Any]:
    """The winner's other modelled splits of ``num_gpus``, best first: the async pick's fallbacks."""
    decision = getattr(rec, "async_decision", None)
    splits = getattr(decision, "splits", None)
    if spec.mode != "async" or splits is None or splits.total_gpus != num_gpus:
        return []
    return [
        r.choice
        for r in splits.rows
        if r.label == rec.winner.label
        and r.choice.rollout_gpus is not None
        and r.choice.rollout_gpus != spec.rollout_gpus
    ]


def _pick_at(rec: Recommendation, choice: Any, num_gpus: int, note: str) -> AsyncPick | None:
    """The async pick moved to ``choice``'s split of ``num_gpus`` (and its cap), ``note`` saying why."""
    pick = getattr(rec, "async_choice", None)
    if pick is None:
        return None
    g = int(choice.rollout_gpus)
    return dataclasses.replace(
        pick,
        rollout_gpus=g,
        train_gpus=num_gpus - g,
        total_gpus=num_gpus,
        in_flight_cap=queue_cap(choice.in_flight_cap),
        split_note=note,
    )
