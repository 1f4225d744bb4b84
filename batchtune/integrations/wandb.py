"""Weights & Biases CSV exports, in the two shapes W&B produces (no wandb import needed):

- a chart panel's "Download CSV": ``Step`` plus ``<run name> - <metric>`` columns (and
  ``__MIN``/``__MAX`` companions, ignored); one run per run name;
- a run's history (``run.history().to_csv()`` or the run table export): ``_step`` (or ``Step``) plus
  one column per metric (``train/reward``, ``critic/score/mean``, ``_runtime``, ...); one run.

The step is the trainer's logged step (one rollout batch for verl and OpenRLHF). With ``_runtime``
the wall-clock per step is kept as ``wandb/step_wall_s`` and used as the step time.
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

from batchtune.errors import InputError
from batchtune.integrations.common import (
    ImportedRun,
    LogKeys,
    RunInfo,
    StepEntry,
    as_number,
    merge_by_step,
    merge_keys,
)
from batchtune.integrations.convert import build_run
from batchtune.integrations.logs_generic import csv_rows, read_log_text
from batchtune.integrations.openrlhf import OPENRLHF_KEYS
from batchtune.integrations.trl import TRL_KEYS
from batchtune.integrations.verl import VERL_KEYS

# the trainer's own step first: W&B's _step counts log calls (from 0), not optimiser steps
STEP_COLUMNS = ("train/global_step", "global_step", "Step", "_step", "step")
EVAL_STEP_COLUMNS = ("eval/global_step", "global_step")
WALL_KEY = "wandb/step_wall_s"
WANDB_KEYS = merge_keys(OPENRLHF_KEYS, VERL_KEYS, TRL_KEYS, LogKeys(step_s=(WALL_KEY,)))
_SUFFIXES = ("__MIN", "__MAX", "__STEP")


def _is_metric(col: str) -> bool:
    """Not one of W&B's own columns (_step, _runtime, _timestamp) nor a step column."""
    return not col.startswith("_") and col not in (*STEP_COLUMNS, *EVAL_STEP_COLUMNS)


def read_wandb_csv(path: str | Path, info: RunInfo, keys: LogKeys | None = None) -> list[ImportedRun]:
    """Read a W&B CSV export (either shape); ``info`` gives prompts and group_size per step."""
    path = Path(path)
    reader = csv.reader(io.StringIO(read_log_text(path)))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise InputError(f"{path} is empty: expected a W&B CSV export with a Step column") from None
    step_col = next((c for c in STEP_COLUMNS if c in header), None)
    if step_col is None:
        raise InputError(
            f"{path}:1: no step column ({', '.join(STEP_COLUMNS)}); columns are {', '.join(header)}"
        )
    # OpenRLHF logs evaluation in wandb.log calls of their own, with eval/global_step and an empty
    # train/global_step (openrlhf/utils/logging_utils.py, v0.11.0)
    fallback_steps = [c for c in EVAL_STEP_COLUMNS if c in header and c != step_col]
    # column -> (run name, key)
    panel = any(" - " in c for c in header if c != step_col)
    layout: dict[str, tuple[str, str]] = {}
    for col in header:
        if col == step_col or col.endswith(_SUFFIXES):
            continue
        if panel:
            if " - " not in col:
                continue
            run, key = col.split(" - ", 1)
            layout[col] = (run.strip(), key.strip())
        else:
            layout[col] = (info.run_id or path.stem, col)
    runs: dict[str, list[StepEntry]] = {}
    for line, row in csv_rows(reader, header, path):
        raw_step, used = row[step_col].strip(), step_col
        for other in fallback_steps if not raw_step else ():  # an eval row (OpenRLHF: its own step key)
            raw_step, used = row[other].strip(), other
            if raw_step:
                break
        if not raw_step and not any(row[col].strip() for col in layout if _is_metric(col)):
            continue  # a row of W&B's own bookkeeping (_step, _runtime): no step, no metric
        step = as_number(raw_step)
        if step is None or step != int(step) or step < 0:
            raise InputError(f"{path}:{line}: column {used!r}: {raw_step!r} is not a step number")
        per_run: dict[str, dict[str, float]] = {}
        for col, (run, key) in layout.items():
            raw = row[col]
            if not raw.strip():
                continue
            value = as_number(raw)
            if value is None:
                if panel:
                    raise InputError(f"{path}:{line}: column {col!r}: {raw!r} is not a number")
                continue  # history exports carry text columns too
            per_run.setdefault(run, {})[key] = value
        for run, values in per_run.items():
            runs.setdefault(run, []).append(StepEntry(int(step), values, f"{path}:{line}"))
    if not runs:
        raise InputError(f"{path}: no metric values in it")
    out = []
    for run, entries in runs.items():
        entries = merge_by_step(entries)
        prev = None
        for e in entries:
            rt = e.values.get("_runtime")
            if rt is not None and prev is not None and e.step > prev[0] and rt > prev[1]:
                e.values[WALL_KEY] = (rt - prev[1]) / (e.step - prev[0])
            if rt is not None:
                prev = (e.step, rt)
        run_info = replace(info, run_id=run) if len(runs) > 1 or panel else info
        out.append(build_run(entries, run_info, keys or WANDB_KEYS, str(path), run))
    return out
