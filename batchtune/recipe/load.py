"""Loading recipes: TOML, ``--set key=value`` overrides, shipped recipes; unknown keys and wrong types
are collected and reported together, then the cross-field checks of `checks.py` run."""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Any

from batchtune.errors import RecipeError
from batchtune.recipe.checks import check_recipe
from batchtune.recipe.ranges import check_ranges
from batchtune.recipe.schema import CHOICES, LOADER_FIELDS, Recipe
from batchtune.recipe.study import AUTO_MODE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a table"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _convert(value: Any, tp: Any, path: str, errors: list[str]) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a table, got {value!r}")
            return None
        return _build(tp, value, path, errors)
    if origin is list:
        if not isinstance(value, list):
            errors.append(f"{path}: expected {_type_name(tp)}, got {value!r}")
            return None
        (item_tp,) = typing.get_args(tp)
        return [_convert(v, item_tp, f"{path}[{i}]", errors) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a table, got {value!r}")
            return None
        _, val_tp = typing.get_args(tp)
        return {str(k): _convert(v, val_tp, f"{path}.{k}", errors) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        errors.append(f"{path}: unsupported type")  # the schema has no unions
        return None
    if tp is bool:
        if not isinstance(value, bool):
            errors.append(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.append(f"{path}: expected a number, got {value!r}")
            return value
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            errors.append(f"{path}: expected a string, got {value!r}")
        return value
    return value


def _build(cls: Any, data: dict[str, Any], prefix: str, errors: list[str]) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.name not in LOADER_FIELDS}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        if key not in names:
            known = ", ".join(sorted(names))
            section, _, rest = key.partition(".")
            if not prefix and rest and section in names:  # "optimizer.lr" = 1: one quoted key
                errors.append(
                    f'"{key}": a quoted key is one name, not a path; write {key} = ... unquoted, or '
                    f"{rest} = ... under [{section}]"
                )
                continue
            errors.append(f"{path}: unknown key (known here: {known})")
            continue
        converted = _convert(value, hints[key], path, errors)
        choices = CHOICES.get(path)
        if choices is not None and converted not in choices:
            errors.append(f"{path}: {converted!r} is not one of {', '.join(map(repr, choices))}")
        kwargs[key] = converted
    try:
        return cls(**kwargs)
    except TypeError as exc:  # only reachable through a schema bug
        errors.append(f"{prefix or 'recipe'}: {exc}")
        return None


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
    recipe = _build(Recipe, data, "", errors)
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
