"""The one way a command gets its recipe: read (a file, a shipped name, the default, or the recipe
stored with the results), ``--set`` overrides applied, every type and cross-field check run,
``probe.mode = "auto"`` resolved, and the results directory applied."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from batchtune.errors import InputError
from batchtune.measure.probe_size import resolved
from batchtune.recipe.load import DEFAULT_RECIPE, apply_overrides, load_recipe, recipe_from_dict
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore


def load(
    recipe: str | None = None,
    overrides: Sequence[str] = (),
    results: str | None = None,
    *,
    stored: bool = False,
    resolve: bool = True,
) -> Recipe:
    """The recipe ``recipe`` names (None: the default), checked, with ``overrides`` applied and the
    results directory ``results`` (None: the recipe's own).

    ``stored``: with no recipe named, the recipe stored in ``results``/manifest.json comes first
    (recommend, report). ``resolve=False`` keeps ``probe.mode = "auto"`` as written (recipes show)."""
    cfg = _stored(results, overrides) if stored and recipe is None and results is not None else None
    if cfg is None:
        cfg = load_recipe(recipe or DEFAULT_RECIPE, list(overrides))
    return (resolved(cfg) if resolve else cfg).with_results_dir(results)


def _stored(results: str, overrides: Sequence[str]) -> Recipe | None:
    """The recipe in the results directory's manifest, overrides applied; None when there is none."""
    manifest = ResultsStore(results).read_manifest()
    if manifest is not None and not isinstance(manifest.get("recipe"), dict):
        raise InputError(f"{results}/manifest.json has no recipe table; name one: recommend RECIPE")
    if not manifest:
        return None
    data = apply_overrides(manifest["recipe"], list(overrides))
    return recipe_from_dict(data, f"{results}/manifest.json")


def results_is_a_folder(cfg: Recipe) -> Recipe:
    """``cfg``, refused when its results directory is a file (it would fail later with "File
    exists" or "Not a directory")."""
    path = Path(cfg.run.results_dir)
    if path.exists() and not path.is_dir():
        raise InputError(f"results directory {path} is a file: give a folder with --results DIR")
    return cfg
