"""TOML tables into typed dataclasses. Each key is checked against its field's type hint (and, where
given, the values it may take); unknown keys and wrong types are collected, one message each, naming
the field by its path. The recipe (recipe/load.py) and the measurements file
(integrations/measurements.py) are both read this way.

Types: a dataclass (a table), ``list[T]``, ``dict[str, T]``, bool, int, float (an integer is taken),
str, and ``T | None`` (None: the key was not given; TOML has no null)."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any

Choices = Mapping[str, tuple[Any, ...]]  # dotted path -> the values it may take


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is list:
        return f"a list of {type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a table"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


@functools.cache
def field_types(cls: Any) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, evaluated once per class: a recipe is read table by table on
    every load and every ``--set``, and evaluating the hints again was most of reading one.
    Read-only."""
    return typing.get_type_hints(cls)


def read_table(
    cls: Any,
    data: dict[str, Any],
    prefix: str,
    errors: list[str],
    *,
    choices: Choices | None = None,
    skip: Collection[str] = (),
) -> Any:
    """``data`` as the dataclass ``cls`` (its defaults for keys not given); each problem is appended
    to ``errors`` as ``path: what``. ``skip``: fields never read from a file (set by the loader)."""
    hints = field_types(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.name not in skip}
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
        converted = _convert(value, hints[key], path, errors, choices)
        allowed = (choices or {}).get(path)
        if allowed is not None and converted not in allowed:
            errors.append(f"{path}: {converted!r} is not one of {', '.join(map(repr, allowed))}")
        kwargs[key] = converted
    try:
        return cls(**kwargs)
    except TypeError as exc:  # only reachable through a schema bug
        errors.append(f"{prefix or 'recipe'}: {exc}")
        return None


def _convert(value: Any, tp: Any, path: str, errors: list[str], choices: Choices | None) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a table, got {value!r}")
            return None
        return read_table(tp, value, path, errors, choices=choices)
    if origin is list:
        if not isinstance(value, list):
            errors.append(f"{path}: expected {type_name(tp)}, got {value!r}")
            return None
        (item_tp,) = typing.get_args(tp)
        return [_convert(v, item_tp, f"{path}[{i}]", errors, choices) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a table, got {value!r}")
            return None
        _, val_tp = typing.get_args(tp)
        return {str(k): _convert(v, val_tp, f"{path}.{k}", errors, choices) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        given = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(given) == 1:  # T | None: a value given is a T
            return _convert(value, given[0], path, errors, choices)
        errors.append(f"{path}: unsupported type")  # no schema has other unions
        return None
    return _scalar(value, tp, path, errors)


def _scalar(value: Any, tp: Any, path: str, errors: list[str]) -> Any:
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
