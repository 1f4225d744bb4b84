"""A trainer config file flattened into ``dotted.name -> (value, line)`` for `batchtune check`: YAML
(nested keys), JSON, TOML, or command lines (``--flag value``, ``--flag=value``, Hydra
``key=value`` across backslash continuations). The line of each value lets CI annotations point at it.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchtune.errors import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Flat = dict[str, tuple[Any, int | None]]

# A config from a pull request is untrusted input to the CI gate: bound what reading it may cost.
MAX_DEPTH = 100  # nesting levels of a mapping (trainer configs use under 10)
MAX_NODES = 100_000  # values visited while flattening (YAML aliases can multiply them: a "bomb")


def _too_deep(path: Path, line: int | None = None) -> InputError:
    where = f"{path}:{line}" if line else str(path)
    return InputError(f"{where}: nested deeper than {MAX_DEPTH} levels, not a trainer config")


def _flatten(obj: Any, prefix: str, out: dict[str, Any], path: Path, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise _too_deep(path)
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out, path, depth + 1)
    else:
        out[prefix] = obj


def _yaml_flat(text: str, path: Path) -> Flat | None:
    """Nested YAML mapping -> dotted keys with the line of each scalar; None if not a mapping.
    Aliases are followed (``<<: *defaults`` is common), but a recursive one, nesting past
    MAX_DEPTH and more than MAX_NODES values visited (an alias bomb) are refused."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise InputError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    except RecursionError:
        raise _too_deep(path) from None
    if not isinstance(node, yaml.MappingNode):
        return None
    out: Flat = {}
    visited = 0

    def walk(n: Any, prefix: str, above: tuple[int, ...]) -> None:
        nonlocal visited
        visited += 1
        line = n.start_mark.line + 1
        if visited > MAX_NODES:
            raise InputError(
                f"{path}: expands to more than {MAX_NODES} values (YAML aliases multiplying "
                "them?), not a trainer config"
            )
        if id(n) in above:
            raise InputError(f"{path}:{line}: a YAML alias that contains itself (recursive)")
        if len(above) > MAX_DEPTH:
            raise _too_deep(path, line)
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                walk(v, f"{prefix}.{k.value}" if prefix else str(k.value), (*above, id(n)))
        elif isinstance(n, yaml.ScalarNode):
            value = yaml.safe_load(n.value) if n.style is None else n.value
            out[prefix] = (value, line)
        else:
            out[prefix] = (None, line)

    walk(node, "", ())
    return out


def _line_of_key(lines: list[str], key: str, pattern: str) -> int | None:
    rx = re.compile(pattern.format(key=re.escape(key)))
    return next((i for i, ln in enumerate(lines, 1) if rx.search(ln)), None)


def _parsed_flat(text: str, path: Path, loads: Callable[[str], Any], key_pattern: str) -> Flat:
    """``loads(text)`` flattened to dotted keys, each value with the first line that matches
    ``key_pattern`` (``{key}``: its last key); nesting too deep to parse or past MAX_DEPTH is refused."""
    try:
        data = loads(text)
    except RecursionError:
        raise _too_deep(path) from None
    flat: dict[str, Any] = {}
    _flatten(data, "", flat, path)
    lines = text.splitlines()
    return {k: (v, _line_of_key(lines, k.split(".")[-1], key_pattern)) for k, v in flat.items()}


def _json_flat(text: str, path: Path) -> Flat:
    def loads(text: str) -> dict[str, Any]:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            raise InputError(f"{path}: expected a JSON object of settings")
        return data

    return _parsed_flat(text, path, loads, r'"{key}"\s*:')


def _toml_flat(text: str, path: Path) -> Flat:
    def loads(text: str) -> dict[str, Any]:
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{path}: not valid TOML ({exc})") from None

    return _parsed_flat(text, path, loads, r"^\s*{key}\s*=")


def _args_flat(text: str, path: Path) -> Flat:
    """Command lines: ``--flag value``, ``--flag=value`` and Hydra ``key=value`` (``+``/``++`` kept
    off), across backslash continuations; comments after ``#`` ignored; the last value wins."""
    out: Flat = {}
    pending: tuple[str, int] | None = None
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if line.endswith("\\"):
            line = line[:-1]
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as exc:
            raise InputError(
                f"{path}:{i}: cannot split into arguments ({exc}); is it a trainer config (YAML, JSON, "
                "TOML or a launch command)?"
            ) from None
        for tok in tokens:
            if pending is not None and not tok.startswith("--"):
                out[pending[0]] = (tok, pending[1])
                pending = None
                continue
            if pending is not None:  # a flag with no value: a switch
                out[pending[0]] = (True, pending[1])
                pending = None
            if tok.startswith("--"):
                name, eq, value = tok.partition("=")
                if eq:
                    out[name] = (value, i)
                else:
                    pending = (name, i)
            elif "=" in tok and not tok.startswith("-"):
                name, _, value = tok.partition("=")
                out[name.lstrip("+~")] = (value, i)
    if pending is not None:
        out[pending[0]] = (True, pending[1])
    return out


# files a user may pass by mistake (README.md, a log): refused by name, not parsed as arguments
NOT_CONFIGS = (".md", ".markdown", ".rst", ".html", ".csv", ".jsonl", ".ipynb", ".pdf")


def read_flat(path: Path, fmt: str) -> tuple[Flat, str]:
    """The file's settings and what shape they were in (mapping or args)."""
    if path.is_dir():
        raise InputError(f"trainer config {path} is a folder: give the config file")
    if not path.is_file():
        raise InputError(f"trainer config {path} not found")
    suffix = path.suffix.lower()
    if suffix in NOT_CONFIGS:
        raise InputError(
            f"{path} is not a trainer config (a {suffix} file): give the trainer's YAML, JSON or TOML "
            "config, or its launch script"
        )
    text = path.read_text()
    if suffix == ".json":
        return _json_flat(text, path), "mapping"
    if suffix == ".toml":
        return _toml_flat(text, path), "mapping"
    if suffix in (".yaml", ".yml") or fmt in ("verl", "trl"):
        try:
            flat = _yaml_flat(text, path)
        except InputError:
            if suffix in (".yaml", ".yml"):
                raise
            flat = None
        if flat is not None:
            return flat, "mapping"
    return _args_flat(text, path), "args"
