"""`batchtune pretrain`: from pre-training loss curves a user already has (one run per batch size
and seed) to B_opt and B_min at each target loss, with brackets, checked fits and paired-seed
intervals (analysis/pretrain/batch.estimate_batches, through analysis/pretrain/grid.analyse_grid),
and a token-keyed batch schedule (docs/method.md §6, docs/pretraining.md).

Input: per-step logs (CSV or JSON lines), one row per logged step, with a run name, the batch in
tokens, the step and the loss; an optional ``seed`` column pairs runs across batches (without it
the runs at each batch are paired in name order). Each run's tokens are ``step * batch_tokens``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchtune.analysis.pretrain.grid import GridAnalysis, GridCurve, analyse_grid
from batchtune.errors import InputError

COLUMNS = ("run", "batch_tokens", "step", "loss")
OPTIONAL_COLUMNS = ("seed",)  # pairs runs across batches; absent: runs paired in name order


@dataclass(frozen=True)
class PretrainRun:
    name: str
    batch_tokens: float
    steps: np.ndarray
    loss: np.ndarray
    seed: int | None = None
    diverged_at: float | None = None  # the step of its first non-finite loss; the rows after it are dropped


@dataclass(frozen=True)
class PretrainAnalysis:
    """The grid analysis of the logs, and how their runs were paired into seeds."""

    grid: GridAnalysis
    runs: tuple[tuple[str, float, int], ...]  # (run, batch_tokens, seed index) of every run used
    notes: tuple[str, ...]


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte {exc.start})") from None


def read_runs(paths: Sequence[Path], columns: dict[str, str]) -> list[PretrainRun]:
    """Read per-step rows from CSV or JSON-lines files; every problem names file, line and column."""
    names = {c: columns.get(c, c) for c in (*COLUMNS, *OPTIONAL_COLUMNS)}
    rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    seeds: dict[str, int] = {}
    seen: dict[str, set[float]] = defaultdict(set)  # the steps each run logged
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise InputError(f"{p} not found")
        if p.suffix in (".jsonl", ".json"):
            records = []
            for i, line in enumerate(_text(p).splitlines(), 1):
                if line.strip():
                    try:
                        records.append((i, json.loads(line)))
                    except (json.JSONDecodeError, RecursionError):
                        raise InputError(f"{p}:{i}: not valid JSON (or nested too deep)") from None
        else:
            records = list(enumerate(csv.DictReader(io.StringIO(_text(p), newline="")), 2))
        if not records:
            raise InputError(f"{p} has no rows")
        for i, row in records:
            values = []
            for logical in ("batch_tokens", "step", "loss"):
                col = names[logical]
                if col not in row:
                    raise InputError(f"{p}:{i}: no column {col!r} (map it with --map {logical}=COLUMN)")
                try:
                    values.append(float(row[col]))
                except (TypeError, ValueError):
                    raise InputError(f"{p}:{i}: column {col!r}: {row[col]!r} is not a number") from None
                low = {"batch_tokens": 0.0, "step": -1.0}.get(logical, -math.inf)  # batch > 0, step >= 0
                if logical == "loss" and not math.isfinite(values[-1]):
                    continue  # a diverged run's loss (inf, nan): data, kept as where it diverged
                if not (math.isfinite(values[-1]) and values[-1] > low):
                    raise InputError(f"{p}:{i}: column {col!r}: {row[col]!r} is out of range")
            run = str(row.get(names["run"], p.stem))
            if row.get(names["seed"]) not in (None, ""):
                try:
                    seed = int(float(row[names["seed"]]))
                except (TypeError, ValueError):
                    raise InputError(
                        f"{p}:{i}: column {names['seed']!r}: {row[names['seed']]!r} is not a seed"
                    ) from None
                if seeds.setdefault(run, seed) != seed:
                    raise InputError(
                        f"{p}:{i}: run {run!r} has seeds {seeds[run]} and {seed}: give each seed its "
                        "own run name"
                    )
            if values[1] in seen[run]:
                raise InputError(
                    f"{p}:{i}: run {run!r} logs step {values[1]:g} twice; give each run (and each "
                    "resumed attempt) its own rows"
                )
            seen[run].add(values[1])
            rows[run].append((values[0], values[1], values[2]))
    runs = []
    for name, vals in rows.items():
        arr = np.asarray(sorted(vals, key=lambda v: v[1]))
        if len(set(arr[:, 0])) != 1:
            raise InputError(f"run {name!r} changes its batch_tokens; give each batch its own run name")
        bad = ~np.isfinite(arr[:, 2])
        diverged = float(arr[bad, 1][0]) if bad.any() else None
        if diverged is not None:  # nothing after the first non-finite loss is training
            arr = arr[arr[:, 1] < diverged]
        tokens_ok = arr[:, 1] > 0  # step 0 (before training) carries no tokens
        runs.append(
            PretrainRun(
                name, float(arr[0, 0]) if arr.size else float(vals[0][0]), arr[tokens_ok, 1],
                arr[tokens_ok, 2], seeds.get(name), diverged,
            )
        )  # fmt: skip
    if len({r.batch_tokens for r in runs}) < 3:
        raise InputError("need runs at 3 or more batch sizes to fit the steps-data trade-off")
    return runs


def pair_seeds(runs: Sequence[PretrainRun]) -> tuple[list[tuple[PretrainRun, int]], list[str]]:
    """(run, seed index) pairs: by the ``seed`` column where every run has one, else in name order
    within each batch. Batches with more runs than the fewest are cut to it (a paired bootstrap
    resamples whole seeds), with a note."""
    by_batch: dict[float, list[PretrainRun]] = defaultdict(list)
    for r in runs:
        by_batch[r.batch_tokens].append(r)
    keyed = all(r.seed is not None for r in runs)
    notes, out = [], []
    if keyed:
        common: set[int] = set.intersection(
            *({r.seed for r in rs if r.seed is not None} for rs in by_batch.values())
        )
        dropped = [r.name for r in runs if r.seed not in common]
        order = sorted(common)
        out = [(r, order.index(r.seed)) for r in runs if r.seed in common]
    else:
        n = min(len(rs) for rs in by_batch.values())
        dropped = []
        for rs in by_batch.values():
            rs = sorted(rs, key=lambda r: r.name)
            out += [(r, i) for i, r in enumerate(rs[:n])]
            dropped += [r.name for r in rs[n:]]
    if not out:
        raise InputError("no seed is shared by every batch: give each batch's runs the same seeds")
    if dropped:
        notes.append(
            f"left out {', '.join(sorted(dropped))}: seeds are paired across batches and not every "
            "batch has these"
        )
    return out, notes


def analyse(
    runs: Sequence[PretrainRun],
    targets: Sequence[float],
    *,
    base_lr: float,
    rule: str = "sqrt",
    confidence: float = 0.9,
) -> PretrainAnalysis:
    """B_opt and B_min per target (the grid estimators, docs/pretraining.md §5) and the schedule.

    Without targets, four levels between what most runs and what only the best runs reached."""
    empty = [r.name for r in runs if r.steps.size == 0]  # diverged before its first logged loss
    kept = [r for r in runs if r.steps.size]
    if empty and len({r.batch_tokens for r in kept}) < 3:
        raise InputError(
            f"need runs at 3 or more batch sizes; {', '.join(empty)} logged no finite loss after step 0 "
            "(diverged at once) and cannot be read"
        )
    paired, notes = pair_seeds(kept)
    if empty:
        notes.append(
            f"left out {', '.join(empty)}: no finite loss after step 0 (diverged at once); such a "
            "batch reached no target, which its table row cannot show"
        )
    notes = [
        *(
            f"run {r.name} diverged at step {r.diverged_at:g} (a non-finite loss): it counts as never "
            "reaching a loss it had not reached by then"
            for r, _ in paired
            if r.diverged_at is not None
        ),
        *notes,
    ]
    curves = [
        GridCurve(r.batch_tokens, seed, tuple(r.steps * r.batch_tokens), tuple(r.loss.astype(float)))
        for r, seed in paired
    ]
    grid = analyse_grid(curves, list(targets), base_lr=base_lr, rule=rule, confidence=confidence)
    used = tuple(sorted((r.name, r.batch_tokens, seed) for r, seed in paired))
    return PretrainAnalysis(grid, used, tuple(notes))
