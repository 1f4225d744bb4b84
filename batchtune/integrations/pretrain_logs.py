"""Pre-training loss logs (CSV or JSON lines) read into runs for `batchtune pretrain`.

One row per logged step, with a run name, the batch in tokens, the step and the loss; an optional
``seed`` column pairs runs across batches (analysis/pretrain/logs.pair_seeds). Every problem names
the file, the line and the column. The rows are read by logs_generic.read_rows, like every generic log.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from batchtune.analysis.pretrain.logs import PretrainRun
from batchtune.errors import InputError
from batchtune.integrations.logs_generic import read_rows

COLUMNS = ("run", "batch_tokens", "step", "loss")
OPTIONAL_COLUMNS = ("seed",)  # pairs runs across batches; absent: runs paired in name order
_LOW = {"batch_tokens": 0.0, "step": -1.0, "loss": -math.inf}  # batch > 0, step >= 0


def _numbers(where: str, row: Mapping[str, object], names: Mapping[str, str]) -> tuple[float, float, float]:
    """(batch_tokens, step, loss) of one row; a non-finite loss is kept (where a run diverged)."""
    values = []
    for logical in ("batch_tokens", "step", "loss"):
        col = names[logical]
        if col not in row:
            raise InputError(f"{where}: no column {col!r} (map it with --map {logical}=COLUMN)")
        raw = row[col]
        try:
            value = float(raw)  # type: ignore[arg-type]  # str or number; anything else is refused
        except (TypeError, ValueError):
            raise InputError(f"{where}: column {col!r}: {raw!r} is not a number") from None
        if not (logical == "loss" and not math.isfinite(value)) and not (
            math.isfinite(value) and value > _LOW[logical]
        ):
            raise InputError(f"{where}: column {col!r}: {raw!r} is out of range")
        values.append(value)
    return values[0], values[1], values[2]


def _seed(where: str, row: Mapping[str, object], col: str) -> int | None:
    raw = row.get(col)
    if raw in (None, ""):
        return None
    try:
        return int(float(raw))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"{where}: column {col!r}: {raw!r} is not a seed") from None


def _run_of(name: str, vals: list[tuple[float, float, float]], seed: int | None) -> PretrainRun:
    """One run from its rows, sorted by step; nothing after its first non-finite loss is training."""
    arr = np.asarray(sorted(vals, key=lambda v: v[1]))
    if len(set(arr[:, 0])) != 1:
        raise InputError(f"run {name!r} changes its batch_tokens; give each batch its own run name")
    bad = ~np.isfinite(arr[:, 2])
    diverged = float(arr[bad, 1][0]) if bad.any() else None
    if diverged is not None:
        arr = arr[arr[:, 1] < diverged]
    tokens_ok = arr[:, 1] > 0  # step 0 (before training) carries no tokens
    batch = float(arr[0, 0]) if arr.size else float(vals[0][0])
    return PretrainRun(name, batch, arr[tokens_ok, 1], arr[tokens_ok, 2], seed, diverged)


def read_runs(paths: Sequence[Path], columns: Mapping[str, str]) -> list[PretrainRun]:
    """Read per-step rows from CSV or JSON-lines files (``.jsonl``/``.json``: JSON lines, else CSV)."""
    names = {c: columns.get(c, c) for c in (*COLUMNS, *OPTIONAL_COLUMNS)}
    rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    seeds: dict[str, int] = {}
    seen: dict[str, set[float]] = defaultdict(set)  # the steps each run logged
    for path in paths:
        p = Path(path)
        if p.is_dir():
            raise InputError(f"{p} is a folder: give the CSV or JSONL loss logs in it")
        if not p.is_file():
            raise InputError(f"{p} not found")
        _, records = read_rows(p, "jsonl" if p.suffix in (".jsonl", ".json") else "csv")
        if not records:
            raise InputError(f"{p} has no rows")
        for i, row in records:
            where = f"{p}:{i}"
            numbers = _numbers(where, row, names)
            run = str(row.get(names["run"], p.stem))
            seed = _seed(where, row, names["seed"])
            if seed is not None and seeds.setdefault(run, seed) != seed:
                raise InputError(
                    f"{where}: run {run!r} has seeds {seeds[run]} and {seed}: give each seed its own run name"
                )
            if numbers[1] in seen[run]:
                raise InputError(
                    f"{where}: run {run!r} logs step {numbers[1]:g} twice; give each run (and each "
                    "resumed attempt) its own rows"
                )
            seen[run].add(numbers[1])
            rows[run].append(numbers)
    runs = [_run_of(name, vals, seeds.get(name)) for name, vals in rows.items()]
    if len({r.batch_tokens for r in runs}) < 3:
        raise InputError("need runs at 3 or more batch sizes to fit the steps-data trade-off")
    return runs
