"""Generic per-step logs: CSV or JSON lines, one row per optimiser step, any trainer.

Columns (logical name -> default column; rename with ``columns={"reward": "train/acc", ...}``):

    run         run name (optional: one run per file otherwise)
    prompts     P per step         group_size  G         lr     actor LR at the step
    seed        seed               samples     responses consumed so far (or give step)
    step        optimiser step; samples = step * prompts * group_size when no samples column
    grad_norm, critic_grad_norm    pre-clip norms (optional)
    tokens      generated tokens so far (optional)     gen_s, train_s, other_s  seconds (optional)
    step_s      the whole step's seconds (optional; alone it is a throughput source: other_s =
                step_s - gen_s - train_s, and a given other_s is then ignored)

Every other numeric column is kept as a metric under its own name; a logical name that is none of the
above maps a metric, e.g. ``eval_reward="val/acc"`` (that column is then required). prompts,
group_size, lr and seed may come from ``RunInfo`` instead of columns. Input is validated whole before
anything is returned: a bad file raises one InputError naming the file, line and column.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from batchtune.errors import InputError
from batchtune.integrations.common import ImportedRun, LogKeys, RunInfo, StepEntry, as_number
from batchtune.integrations.convert import build_run


def read_log_text(path: Path) -> str:
    """A log file's text: a missing path, and one that is no regular file (a FIFO would block
    forever), are told apart; a UTF-8 byte-order mark (Excel's CSV) is dropped."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if not path.is_file():
        raise InputError(f"{path} is not a regular file (a folder, pipe or device): give a log file")
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte {exc.start})") from None


COLUMNS: dict[str, str] = {
    "run": "run",
    "prompts": "prompts",
    "group_size": "group_size",
    "lr": "lr",
    "seed": "seed",
    "samples": "samples",
    "step": "step",
    "grad_norm": "grad_norm",
    "critic_grad_norm": "critic_grad_norm",
    "tokens": "tokens",
    "gen_s": "gen_s",
    "train_s": "train_s",
    "other_s": "other_s",
    "step_s": "step_s",
}
_INTEGER = ("prompts", "group_size", "seed", "samples", "step")


def _rows_csv(path: Path, text: str, partial: bool) -> tuple[list[str], list[tuple[int, dict[str, object]]]]:
    if partial and text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise InputError(f"{path} is empty: expected a header line and one row per step") from None
    header = [h.strip() for h in header]
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        raise InputError(f"{path}:1: duplicate column(s) {', '.join(dupes)}")
    rows: list[tuple[int, dict[str, object]]] = list(csv_rows(reader, header, path))
    return header, rows


def csv_rows(reader: Any, header: list[str], path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows after a CSV's header as (line, column -> cell), blank lines skipped; a row whose
    field count is not the header's is refused."""
    for cells in reader:
        line = reader.line_num
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise InputError(f"{path}:{line}: {len(cells)} fields, the header has {len(header)}")
        yield line, dict(zip(header, cells, strict=True))


def _flatten(obj: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def _rows_jsonl(
    path: Path, text: str, partial: bool
) -> tuple[list[str], list[tuple[int, dict[str, object]]]]:
    lines = text.split("\n")
    if partial and lines and lines[-1].strip():
        lines = lines[:-1]  # still being written
    rows = []
    header: list[str] = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            flat = _flatten(obj) if isinstance(obj, dict) else {}
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{i}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise InputError(f"{path}:{i}: nested too deep to be a log line") from None
        if not isinstance(obj, dict):
            raise InputError(f"{path}:{i}: expected a JSON object per line, got {type(obj).__name__}")
        header.extend(k for k in flat if k not in header)
        rows.append((i, flat))
    if not rows:
        raise InputError(f"{path} is empty: expected one JSON object per step")
    return header, rows


def read_rows(
    path: Path, fmt: str, partial: bool = False
) -> tuple[list[str], list[tuple[int, dict[str, object]]]]:
    """The header and the (line number, row) pairs of a CSV (``fmt="csv"``) or JSON-lines file;
    ``partial=True`` drops a last line still being written. Bad input raises one InputError naming
    the file and line."""
    if path.is_dir():
        raise InputError(
            f"{path} is a folder: give the log file in it (folders are read with --format verl, trl "
            "or tensorboard)"
        )
    text = read_log_text(path)
    if not text.strip():
        raise InputError(f"{path} is empty: expected a header line and one row per step")
    return (_rows_csv if fmt == "csv" else _rows_jsonl)(path, text, partial)


@dataclass(frozen=True)
class _Columns:
    """Where a table's logical columns are (``cols``), which it has, and the metrics it carries."""

    path: Path
    cols: dict[str, str]
    has: dict[str, bool]
    metric_cols: dict[str, str]  # a mapped metric name -> its column (required)
    numeric_extra: list[str]  # every other column with a number in it: kept under its own name


def _columns(
    path: Path,
    header: list[str],
    rows: list[tuple[int, dict[str, object]]],
    columns: Mapping[str, str] | None,
    info: RunInfo,
) -> _Columns:
    """The table's columns against the logical names (module docstring); what is missing is refused."""
    cols = dict(COLUMNS)
    if "run" not in header and "run_id" in header:  # a run_id key names the run as well as "run"
        cols["run"] = "run_id"
    metric_cols: dict[str, str] = {}
    for name, col in (columns or {}).items():
        if name in COLUMNS:
            cols[name] = col
        else:
            metric_cols[name] = col
    for name, col in metric_cols.items():
        if col not in header:
            raise InputError(
                f"{path}:1: no column {col!r} for metric {name}; columns are {', '.join(header)}"
            )
    has = {name: col in header for name, col in cols.items()}
    if not (has["step"] or has["samples"]):
        raise InputError(
            f"{path}:1: missing column {cols['step']!r} (or {cols['samples']!r}); columns are "
            f"{', '.join(header)}; map yours, e.g. step=global_step"
        )
    given = {"prompts": info.prompts, "group_size": info.group_size, "lr": info.lr}
    for name in ("prompts", "group_size", "lr"):
        if not has[name] and not given[name]:
            raise InputError(
                f"{path}:1: missing column {cols[name]!r} and no {name} given; add the column, map it "
                f"({name}=COLUMN) or pass {name}"
            )
    reserved = {cols[n] for n in cols if has[n]} | set(metric_cols.values())
    extra = [c for c in header if c not in reserved]
    numeric_extra = [c for c in extra if any(as_number(r.get(c)) is not None for _, r in rows)]
    return _Columns(path, cols, has, metric_cols, numeric_extra)


def _number(where: str, col: str, raw: object, required: bool, integer: bool = False) -> float | None:
    value = as_number(raw)
    blank = raw is None or (isinstance(raw, str) and not raw.strip())
    if value is None and not blank:
        raise InputError(f"{where}: column {col!r}: {raw!r} is not a number")
    if value is None and required:
        raise InputError(f"{where}: column {col!r} is empty")
    if value is not None and integer and not (math.isfinite(value) and value == int(value)):
        raise InputError(f"{where}: column {col!r}: {raw!r} is not a whole number")
    return value


def _row_values(c: _Columns, where: str, row: Mapping[str, object]) -> dict[str, float]:
    """One row's numbers under their logical (or metric) names, each checked."""
    cols, has = c.cols, c.has
    values: dict[str, float] = {}
    for logical in ("prompts", "group_size", "seed", "lr", "samples", "step"):
        if has[logical]:
            integer = logical in _INTEGER
            required = logical != "samples" or not has["step"]
            required = required and (logical != "step" or not has["samples"])
            v = _number(where, cols[logical], row.get(cols[logical]), required, integer)
            floor = {"lr": 0.0, "prompts": 1.0, "group_size": 1.0}.get(logical)  # an LR decays to 0
            if v is not None and floor is not None and not (math.isfinite(v) and v >= floor):
                need = ">= 0" if logical == "lr" else "> 0"
                raise InputError(f"{where}: column {cols[logical]!r}: {v!r} must be a finite number {need}")
            if v is not None:
                values[logical] = v
    optional = [
        *((lg, cols[lg]) for lg in _TIMING_AND_NORMS if has[lg]),
        *c.metric_cols.items(),
        *((col, col) for col in c.numeric_extra),
    ]
    for name, col in optional:
        v = _number(where, col, row.get(col), False)
        if v is not None:
            values[name] = v
    if "step_s" in values:  # the whole step: other_s is what gen_s and train_s leave of it
        values["step_s_total"] = values["step_s"]
    elif "other_s" in values:
        values["step_s_total"] = values["other_s"] + values.get("gen_s", 0.0) + values.get("train_s", 0.0)
    return values


_TIMING_AND_NORMS = ("grad_norm", "critic_grad_norm", "tokens", "gen_s", "train_s", "other_s", "step_s")


def read_table(
    path: str | Path,
    columns: Mapping[str, str] | None = None,
    info: RunInfo | None = None,
    fmt: str = "",
    partial: bool = False,
) -> list[ImportedRun]:
    """Read a generic per-step CSV (``fmt="csv"``) or JSONL (``"jsonl"``; default: by suffix).

    ``partial=True`` ignores a last line still being written (for tailing a live log).
    """
    path = Path(path)
    info = info or RunInfo()
    header, rows = read_rows(
        path, fmt or ("csv" if path.suffix.lower() in (".csv", ".tsv") else "jsonl"), partial
    )
    c = _columns(path, header, rows, columns, info)
    runs: dict[str, list[StepEntry]] = {}
    fixed: dict[str, dict[str, float]] = {}
    for line, row in rows:
        name = str(row.get(c.cols["run"], "")).strip() if c.has["run"] else ""
        name = name or info.run_id or path.stem
        where = f"{path}:{line}"
        values = _row_values(c, where, row)
        run_fixed = fixed.setdefault(name, {})
        for logical in ("prompts", "group_size", "seed"):
            if logical in values:
                old = run_fixed.setdefault(logical, values[logical])
                if old != values[logical]:
                    raise InputError(
                        f"{where}: column {c.cols[logical]!r} changes within run {name!r} "
                        f"({old:g} -> {values[logical]:g}); one run has one batch and seed"
                    )
        samples = int(values["samples"]) if "samples" in values else None
        step = int(values["step"]) if "step" in values else len(runs.get(name, [])) + 1
        runs.setdefault(name, []).append(StepEntry(step=step, values=values, where=where, samples=samples))
    return [_run_of(c, name, entries, fixed.get(name, {}), info) for name, entries in runs.items()]


def _run_of(
    c: _Columns, name: str, entries: list[StepEntry], run_fixed: dict[str, float], info: RunInfo
) -> ImportedRun:
    """One run of the table from its rows (sorted by step, a step logged twice refused)."""
    # the rows already carry logical names: identity keys (step_s_total gives other_s back)
    keys = LogKeys(
        grad_norm=("grad_norm",),
        critic_grad_norm=("critic_grad_norm",),
        lr=("lr",) if c.has["lr"] else (),
        gen_s=("gen_s",),
        train_s=("train_s",),
        step_s=("step_s_total",),
    )
    run_info = RunInfo(
        prompts=int(run_fixed.get("prompts", info.prompts)),
        group_size=int(run_fixed.get("group_size", info.group_size)),
        lr=info.lr,
        seed=int(run_fixed.get("seed", info.seed)),
        critic_lr=info.critic_lr,
        run_id=name,
        candidate=info.candidate,
        samples_per_step=info.samples_per_step,
        staleness=info.staleness,
        updates_per_batch=info.updates_per_batch,
    )
    if c.has["step"]:
        entries = sorted(entries, key=lambda e: e.step)
        for a, b in zip(entries, entries[1:], strict=False):
            if a.step == b.step:
                raise InputError(f"{b.where}: step {b.step} appears twice in run {name!r}")
    return _strip_bookkeeping(build_run(entries, run_info, keys, str(c.path), name))


def _strip_bookkeeping(run: ImportedRun) -> ImportedRun:
    """Drop the reader's own helper values (batch, seed, timing totals) from the metrics."""
    skip = set(COLUMNS) | {"step_s_total"}
    steps = tuple(
        replace(s, metrics={k: v for k, v in s.metrics.items() if k not in skip}) for s in run.steps
    )
    return replace(run, steps=steps)
