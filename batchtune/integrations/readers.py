"""Reading any supported log by format name, and storing imported runs like probe runs.

Formats (``backend.command_log_format`` and the import command use the same names):

    jsonl, csv    generic per-step tables (logs_generic.py)
    verl          verl's JSONL file logger (verl.py)
    trl           transformers/TRL trainer_state.json (trl.py)
    tensorboard   event files, e.g. OpenRLHF --logger.tensorboard_dir (tensorboard.py)
    wandb         W&B CSV exports (wandb.py)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from batchtune.errors import InputError
from batchtune.integrations.common import ImportedRun, LogKeys, RunInfo
from batchtune.integrations.convert import label_apart
from batchtune.records.store import ResultsStore

FORMATS = ("jsonl", "csv", "verl", "trl", "tensorboard", "wandb")
STREAMABLE = ("jsonl", "csv", "verl")  # line-oriented: can be read while the trainer still writes


def default_keys(fmt: str) -> LogKeys:
    """The log keys a format's reader uses unless the user maps others."""
    if fmt == "verl":
        from batchtune.integrations.verl import VERL_KEYS

        return VERL_KEYS
    if fmt == "trl":
        from batchtune.integrations.trl import TRL_KEYS

        return TRL_KEYS
    if fmt == "tensorboard":
        from batchtune.integrations.tensorboard import TENSORBOARD_KEYS

        return TENSORBOARD_KEYS
    if fmt == "wandb":
        from batchtune.integrations.wandb import WANDB_KEYS

        return WANDB_KEYS
    return LogKeys()


def read_log(
    path: str | Path,
    fmt: str,
    info: RunInfo | None = None,
    keys: Mapping[str, str] | None = None,
    partial: bool = False,
) -> list[ImportedRun]:
    """Read the runs in ``path``. ``keys`` maps batchtune names to the log's names (for jsonl/csv:
    logical names to columns); ``partial`` tolerates a line still being written (streamable formats)."""
    info = info or RunInfo()
    if fmt not in FORMATS:
        raise InputError(f"unknown log format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt in ("jsonl", "csv"):
        from batchtune.integrations.logs_generic import read_table

        return read_table(path, keys, info, fmt, partial)
    mapped = default_keys(fmt).override(keys)
    if fmt == "verl":
        from batchtune.integrations.verl import read_verl

        return [read_verl(path, info, mapped, partial)]
    if fmt == "trl":
        from batchtune.integrations.trl import read_trl_state

        return [read_trl_state(path, info, mapped)]
    if fmt == "tensorboard":
        from batchtune.integrations.tensorboard import read_tensorboard

        return read_tensorboard(path, info, mapped)
    from batchtune.integrations.wandb import read_wandb_csv

    return read_wandb_csv(path, info, mapped)


@dataclass(frozen=True)
class ImportResult:
    added: tuple[str, ...]  # run ids written
    skipped: tuple[str, ...]  # run ids already in the store (left untouched)
    diverged: tuple[tuple[str, str], ...] = ()  # (run id, why) of the added runs stored as diverged


def import_runs(store: ResultsStore, runs: Sequence[ImportedRun], backend: str = "import") -> ImportResult:
    """Store imported runs exactly like finished probe runs. Everything is checked first, so a bad
    batch writes nothing; runs already in the store are skipped, never overwritten. An on-policy run
    at another updates per batch than the store's is its own candidate (convert.label_apart)."""
    runs = label_apart(runs, store.runs())
    seen: dict[str, str] = {}
    for run in runs:
        if run.run_id in seen:
            raise InputError(
                f"two imported runs are both named {run.run_id!r} ({seen[run.run_id]} and {run.source}); "
                "give distinct run ids"
            )
        seen[run.run_id] = run.source
        if not run.steps:
            raise InputError(f"{run.source}: run {run.run_id!r} has no steps")
        if any(s.run_id != run.run_id for s in run.steps):
            raise InputError(f"{run.source}: run {run.run_id!r} holds steps of another run")
    added, skipped, diverged = [], [], []
    for run in runs:
        record, steps = run.to_records(backend)
        if store.add_finished_run(record, steps):
            added.append(run.run_id)
            if record.status == "diverged":
                diverged.append((run.run_id, record.reason))
        else:
            skipped.append(run.run_id)
    return ImportResult(tuple(added), tuple(skipped), tuple(diverged))
