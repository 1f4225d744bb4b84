"""Loading recipes: TOML, ``--set key=value`` overrides, shipped recipes; unknown keys and wrong types
are collected and reported together (recipe/tables.py), then the ranges and the cross-field checks run."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from batchtune.errors import RecipeError
from batchtune.recipe.checks import check_recipe
from batchtune.recipe.ranges import check_ranges
from batchtune.recipe.schema import CHOICES, LOADER_FIELDS, Recipe
from batchtune.recipe.study import AUTO_MODE
from batchtune.recipe.tables import read_table

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise RecipeError(f"--set {item!r}: expected KEY=VALUE, e.g. --set optimizer.lr=3e-4")
    key, raw = item.split("=", 1)
    key = key.strip()
    if "\n" in raw or "\r" in raw:  # one TOML value, never extra lines smuggled after it
        raise RecipeError(f"--set {key}: the value spans lines; give one value on one line")
    if not key:
        raise RecipeError(f"--set {item!r}: empty key")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word is a string
    except RecursionError:
        raise RecipeError(f"--set {key}: the value is nested too deep") from None
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        parts, value = _parse_override(item)
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RecipeError(f"--set {item!r}: {part} is not a table")
            node = child
        node[parts[-1]] = value
    return data


def recipe_from_dict(data: dict[str, Any], source: str = "") -> Recipe:
    errors: list[str] = []
    recipe = read_table(Recipe, data, "", errors, choices=CHOICES, skip=LOADER_FIELDS)
    if not errors:
        # ranges first: the cross-field checks assume finite, sane values. An "auto" is checked as a
        # grid here; measure/probe_size.resolved checks the recipe again as what it resolves to
        as_given = recipe
        if recipe.probe.mode == AUTO_MODE:
            as_given = dataclasses.replace(recipe, probe=dataclasses.replace(recipe.probe, mode="grid"))
        errors = check_ranges(recipe) or check_recipe(as_given)
    if errors:
        where = f" in {source}" if source else ""
        raise RecipeError(f"{len(errors)} problem(s){where}: " + "; ".join(errors))
    return dataclasses.replace(recipe, source=source)


def load_recipe(path: str | Path | None, overrides: list[str] | None = None) -> Recipe:
    """Load a TOML recipe (or the defaults when ``path`` is None) and apply ``--set`` overrides."""
    data: dict[str, Any] = {}
    source = ""
    if path is not None:
        p = resolve_recipe_path(str(path))
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8-sig"))  # a BOM (Excel, Notepad) is fine
        except tomllib.TOMLDecodeError as exc:
            raise RecipeError(f"{p} is not valid TOML: {exc}") from None
        except RecursionError:
            raise RecipeError(f"{p} is nested too deep to be a recipe") from None
        except UnicodeDecodeError:
            raise RecipeError(f"{p} is not UTF-8 text") from None
        except OSError as exc:
            raise RecipeError(f"{p}: {exc.strerror or exc}") from None
        if not data:
            raise RecipeError(
                f"{p} sets nothing (an empty recipe); start from a shipped one: "
                f"batchtune recipes cp tiny-grpo {p}"
            )
        if is_measurements(data):
            raise RecipeError(
                f"{p} is a measurements file ([study], [[candidate]]), not a recipe: "
                f"batchtune recommend --measurements {path}"
            )
        source = str(p)
    data = apply_overrides(data, overrides or [])
    return recipe_from_dict(data, source)


def recipe_to_toml(recipe: Recipe) -> str:
    """The full recipe with every default spelled out, as TOML (for `batchtune recipe show`)."""
    lines: list[str] = []
    for section, values in recipe.to_dict().items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in value.items()) + "}"
    return repr(value)


DEFAULT_RECIPE = "tiny-grpo"


def shipped_recipes() -> dict[str, Path]:
    """Recipes that ship with batchtune (the repository's recipes/ folder), by name."""
    from importlib import resources

    try:
        root = resources.files("batchtune.recipes")
    except ModuleNotFoundError:  # pragma: no cover - a broken install
        return {}
    return {
        Path(str(entry)).stem: Path(str(entry)) for entry in root.iterdir() if str(entry).endswith(".toml")
    }


def is_measurements(data: dict[str, Any] | str) -> bool:
    """A measurements file (`recommend --measurements`): only [study] and [[candidate]] tables.
    ``data``: the parsed TOML, or its text."""
    if isinstance(data, str):
        data = tomllib.loads(data)
    return bool(data) and set(data) <= {"study", "candidate"}


def resolve_recipe_path(arg: str | None) -> Path:
    """A path, or the name of a shipped recipe (``tiny-grpo``); None means the default recipe."""
    name = arg or DEFAULT_RECIPE
    path = Path(name)
    if path.is_file():
        return path
    if path.exists():
        raise RecipeError(f"recipe {name!r} is not a regular file (a directory, pipe or device)")
    shipped = shipped_recipes()
    key = path.stem if path.suffix == ".toml" else name
    if key in shipped and (arg is None or path.parent == Path(".") or path.parent.name == "recipes"):
        return shipped[key]
    known = ", ".join(sorted(shipped)) or "none found"
    raise RecipeError(f"recipe {name!r} not found: give a TOML file or a shipped name ({known})")
