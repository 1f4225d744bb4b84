"""The one JSON codec: every record on disk and every ``--json`` output goes through here.

JSON has no NaN or infinity. One convention everywhere:

    NaN (unknown)         -> null
    +inf / -inf (never)   -> "inf" / "-inf"

Reading back is typed: a string becomes a float only in a field declared ``float`` (so a run id
``"inf"`` stays a string), and ``null`` in a ``float`` field is NaN again; in an optional
(``float | None``) field it is None, so a NaN there reads back as None (both: no usable value).
Dataclasses become dicts,
tuples lists, numpy scalars and arrays plain numbers and lists, paths strings.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchtune.errors import InputError

_NONFINITE = {
    "inf": math.inf,
    "-inf": -math.inf,
    "Infinity": math.inf,
    "-Infinity": -math.inf,
    "nan": math.nan,
}


def to_jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON values under the convention above."""
    if isinstance(obj, float):
        if math.isnan(obj):
            return None
        return obj if math.isfinite(obj) else ("inf" if obj > 0 else "-inf")
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {name: _plain(getattr(obj, name)) for name in _names(type(obj))}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return to_jsonable(obj.tolist())
    if isinstance(obj, (bytes, bytearray)):
        return obj.decode("utf-8", "replace")
    return str(obj)


def _plain(value: Any) -> Any:
    """`to_jsonable` of one field, with the common plain kinds answered without a call."""
    kind = type(value)
    if kind is int or kind is str or value is None:
        return value
    if kind is float and math.isfinite(value):
        return value
    return to_jsonable(value)


@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def dumps(obj: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """Standard JSON (never the non-standard NaN/Infinity tokens)."""
    return json.dumps(to_jsonable(obj), indent=indent, sort_keys=sort_keys, allow_nan=False)


def loads(text: str, where: str = "") -> Any:
    """Parse JSON; a malformed file is an input error naming it."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{where or 'input'} is not valid JSON: {exc}") from None


def as_float(value: Any, where: str = "") -> float:
    """A float field's stored value: a number, null (NaN) or one of the non-finite strings."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        raise InputError(f"{where}: expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    raise InputError(f"{where}: expected a number, got {value!r}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _decode(value, args[0], where) if len(args) == 1 else value
    if tp is float:
        return as_float(value, where)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise InputError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise InputError(f"{where}: expected a string, got {value!r}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise InputError(f"{where}: expected a table, got {type(value).__name__}")
        _, vt = typing.get_args(tp) or (str, Any)
        return {str(k): _decode(v, vt, f"{where}.{k}") for k, v in value.items()}
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise InputError(f"{where}: expected a list, got {type(value).__name__}")
        elem: tuple[Any, ...] = typing.get_args(tp)
        et = elem[0] if elem else Any
        items = [_decode(v, et, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else list(items)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return from_dict(tp, value, where)
    return value


# Decoders of the common field kinds that answer exactly as `_decode` does for plain values, without
# building the field's error location; anything else (a wrong kind, null, a non-finite string) gets
# _SLOW and goes the general way, which also words the error. A run's steps are decoded this way.
_SLOW: Any = object()


def _fast_float(v: Any) -> Any:
    kind = type(v)
    return v if kind is float else float(v) if kind is int else _SLOW


def _fast_optional_float(v: Any) -> Any:
    return None if v is None else _fast_float(v)


def _fast_int(v: Any) -> Any:
    return v if type(v) is int else _SLOW


def _fast_str(v: Any) -> Any:
    return v if type(v) is str else _SLOW


def _fast_float_table(v: Any) -> Any:
    if type(v) is not dict or not all(type(k) is str and type(x) is float for k, x in v.items()):
        return _SLOW
    return dict(v)


_FAST: dict[Any, Callable[[Any], Any]] = {
    float: _fast_float,
    float | None: _fast_optional_float,
    int: _fast_int,
    str: _fast_str,
    dict[str, float]: _fast_float_table,
}


@functools.cache
def _plan(cls: type) -> tuple[tuple[str, Any, bool, Callable[[Any], Any] | None], ...]:
    """Per field of dataclass ``cls``: name, type, whether required, and its fast decoder if any."""
    hints = _hints(cls)
    plan = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        try:
            fast = _FAST.get(tp)
        except TypeError:  # an unhashable annotation: the general way
            fast = None
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        plan.append((f.name, tp, required, fast))
    return tuple(plan)


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass ``cls`` from a stored dict, decoding each field by its declared type.

    Unknown keys are ignored (older or newer writers); a missing required field, or a value of the
    wrong kind, is an InputError naming ``where`` and the field.
    """
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(data).__name__}")
    plan = _plan(cls)
    missing = [name for name, _, required, _ in plan if required and name not in data]
    if missing:
        raise InputError(f"{where}: record lacks {', '.join(missing)}")
    kwargs = {}
    for name, tp, _, fast in plan:
        if name in data:
            value = data[name]
            out = _SLOW if fast is None else fast(value)
            kwargs[name] = _decode(value, tp, f"{where}: {name}") if out is _SLOW else out
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: {exc}") from None
