"""Wiring for `recommend` and `tune`: where R(B) and Θ(B) come from, and the optional trainer config."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from batchtune.errors import InputError
from batchtune.profile_analysis import analyse_throughput
from batchtune.recipe import DEFAULT_RECIPE, Recipe, load_recipe, recipe_from_dict
from batchtune.recommend import (
    Recommendation,
    ThroughputModel,
    assess_measurements,
    recommend,
    throughput_from_measurements,
    throughput_from_probe,
    throughput_from_profile,
)
from batchtune.records import ResultsStore


def _recipe_for_results(recipe: str | None, overrides: list[str], results: str | None) -> Recipe:
    """The recipe named, else the one stored with the results, else the default recipe."""
    from batchtune.probe import replace_results_dir

    if recipe is None and results is not None:
        manifest = ResultsStore(results).read_manifest()
        if manifest and "recipe" in manifest:
            from batchtune.recipe import apply_overrides

            data = apply_overrides(manifest["recipe"], overrides)
            return replace_results_dir(recipe_from_dict(data, f"{results}/manifest.json"), results)
    return replace_results_dir(load_recipe(recipe or DEFAULT_RECIPE, overrides), results)


def throughput_for(cfg: Recipe, store: ResultsStore, eff: Any, source: str) -> ThroughputModel:
    if source not in ("auto", "profile", "probe"):
        raise InputError(f"--throughput {source!r}: choose auto, profile or probe")
    other = cfg.generation.other_s_per_step
    if source in ("auto", "profile"):
        points = store.throughput()  # analyse_throughput keeps the latest profile of the directory
        profile = analyse_throughput(points, cfg) if points else None
        model = throughput_from_profile(profile, eff.candidates, other)
        if model is not None:
            return model
        if source == "profile":
            raise InputError(
                f"{store.root} has no generation and training profile; run `batchtune profile-gen` first"
            )
    return throughput_from_probe(eff.candidates, other)


def recommend_for_recipe(
    cfg: Recipe, throughput: str, emit: str | None, gpus: int, gpus_per_node: int = 8
) -> tuple[Recommendation, str | None, Any]:
    from batchtune.plan import plan_candidates
    from batchtune.probe import analyse_store

    store = ResultsStore(cfg.run.results_dir)
    if not store.exists():
        raise InputError(f"no results in {store.root}: run `batchtune probe` first, or pass --results")
    plan = plan_candidates(cfg)
    labels = {r.candidate for r in store.runs()}
    use_plan = labels <= set(plan.by_label()) and plan.reference in labels
    eff = analyse_store(store, cfg, plan if use_plan else None)
    rec = recommend(eff, throughput_for(cfg, store, eff, throughput))
    return (rec, *_emit(rec, emit, gpus, cfg, gpus_per_node))


def recommend_from_args(
    recipe: str | None,
    overrides: list[str],
    results: str | None,
    measurements: Path | None,
    throughput: str,
    emit: str | None,
    gpus: int,
    gpus_per_node: int = 8,
) -> tuple[Recommendation, str | None, Any]:
    if measurements is not None:
        if results is not None:
            raise InputError("give either --measurements or --results, not both")
        from batchtune.measurements import load_measurements

        m = load_measurements(measurements)
        rec = recommend(assess_measurements(m), throughput_from_measurements(m))
        if emit is None:
            return rec, None, None
        from batchtune.integrations.emit import emit as emit_config
        from batchtune.integrations.emit import recommendation_input

        winner = next(mc for mc in m.candidates if mc.efficiency.label == rec.winner.label)
        base = recommendation_input(rec, None)
        spec = dataclasses.replace(base, algorithm=m.study.algorithm, critic_lr=winner.critic_lr or 0.0)
        out = emit_config(emit, spec, gpus, gpus_per_node=gpus_per_node)
        return rec, out.text, out.values
    cfg = _recipe_for_results(recipe, overrides, results)
    return recommend_for_recipe(cfg, throughput, emit, gpus, gpus_per_node)


def _emit(
    rec: Recommendation, trainer: str | None, gpus: int, cfg: Recipe | None, gpus_per_node: int
) -> tuple[str | None, Any]:
    if trainer is None:
        return None, None
    from batchtune.integrations.emit import emit_for_recommendation

    out = emit_for_recommendation(rec, trainer, gpus, cfg, gpus_per_node=gpus_per_node)
    return out.text, out.values
