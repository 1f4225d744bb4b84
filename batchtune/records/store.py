"""The results store: one results directory, append-only, atomic, resumable (see the package docstring)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from batchtune import codec
from batchtune.codec import from_dict
from batchtune.errors import InputError
from batchtune.records import check
from batchtune.records.files import atomic_write_text, locked, naming, read_jsonl, read_text, to_json
from batchtune.records.paths import contained
from batchtune.records.types import ModelInfo, RunRecord, StepRecord, ThroughputPoint, failed_before_training


def _read_run(path: Path) -> RunRecord:
    data = codec.loads(read_text(path), f"{path} (delete that run's folder to redo it)")
    record = from_dict(RunRecord, data, str(path))
    check.check_run(record, path)  # run_id, status, counters
    return record


@functools.lru_cache(maxsize=512)
def _decoded_steps(path: str, version: tuple[int, ...]) -> tuple[StepRecord, ...]:
    """A steps file's records, decoded once per version of the file (`_version` keys the cache).

    A probe re-analyses its store after every round of extra seeds; without this it decoded every
    finished run's steps again each time, which was most of an NQM probe's wall time.
    """
    return tuple(from_dict(StepRecord, row, path) for row in read_jsonl(Path(path)))


def _version(st: os.stat_result) -> tuple[int, ...]:
    """What changes when a file is rewritten: a replaced file has another inode, an appended or
    edited one another size or times (the change time even when the modification time is set back)."""
    return st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class RunWriter:
    """Appends the steps of one claimed run and seals it with its RunRecord."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._fh = open(run_dir / "steps.jsonl", "a")

    def append(self, step: StepRecord) -> None:
        with naming(self.run_dir / "steps.jsonl"):
            self._fh.write(to_json(step) + "\n")
            self._fh.flush()

    def finish(self, record: RunRecord) -> None:
        with naming(self.run_dir / "steps.jsonl"):
            os.fsync(self._fh.fileno())
            self._fh.close()
        if not record.finished_at:
            record = dataclasses.replace(record, finished_at=time.time())
        atomic_write_text(self.run_dir / "run.json", to_json(record) + "\n")

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


class _RunSettings(Protocol):
    @property
    def results_dir(self) -> str: ...


class _WithResultsDir(Protocol):  # a Recipe, without records importing the recipe layer
    @property
    def run(self) -> _RunSettings: ...


_MANIFEST_FIX = (
    "restore it from a copy, or delete it and run the probe again with the recipe it ran: its "
    "finished runs are kept and read"
)


class ResultsStore:
    """A results directory: append-only, atomic, resumable (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.runs_dir = self.root / "runs"
        self.plots_dir = self.root / "plots"

    @classmethod
    def of(cls, recipe: _WithResultsDir) -> ResultsStore:
        """The store of a recipe's results directory (``recipe.run.results_dir``)."""
        return cls(recipe.run.results_dir)

    # ---- manifest -------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def read_manifest(self) -> dict[str, Any] | None:
        if not self.manifest_path.exists():
            return None
        try:
            data = codec.loads(read_text(self.manifest_path), str(self.manifest_path))
        except InputError as exc:
            raise InputError(f"{exc}; {_MANIFEST_FIX}") from None
        if not isinstance(data, dict):
            raise InputError(f"{self.manifest_path} is not a JSON object; {_MANIFEST_FIX}")
        return data

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        atomic_write_text(self.manifest_path, codec.dumps(manifest, indent=2) + "\n")

    # ---- runs ----------------------------------------------------------------------------
    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def is_finished(self, run_id: str) -> bool:
        return (self.run_dir(run_id) / "run.json").exists()

    @contextlib.contextmanager
    def claim(self, run_id: str) -> Iterator[RunWriter | None]:
        """Claim a run for writing. Yields None if it is finished or another process holds it.

        A stale steps file left by a crashed attempt is renamed aside, never deleted.
        """
        run_dir = contained(self.root, self.run_dir(run_id), (".lock", "steps.jsonl"))  # no link out
        run_dir.mkdir(parents=True, exist_ok=True)
        with locked(run_dir / ".lock", blocking=False) as got:
            if not got or self.is_finished(run_id):
                yield None
                return
            steps = run_dir / "steps.jsonl"
            if steps.exists() and steps.stat().st_size:
                steps.rename(run_dir / f"steps.stale-{time.time_ns()}.jsonl")
            writer = RunWriter(run_dir)
            try:
                yield writer
            finally:
                writer.close()

    def reopen_failed_starts(self) -> list[RunRecord]:
        """Make every run that failed before training (``failed_before_training``) unfinished again,
        so the next probe runs it; returns their records. Its run.json is renamed beside it
        (``run.failed-start-<ns>.json``), never deleted; a run another process holds is left."""
        reopened = []
        for record in self.runs():
            if not failed_before_training(record):
                continue
            run_dir = self.run_dir(record.run_id)
            with locked(run_dir / ".lock", blocking=False) as got:
                if got and (run_dir / "run.json").exists():
                    (run_dir / "run.json").rename(run_dir / f"run.failed-start-{time.time_ns()}.json")
                    reopened.append(record)
        return reopened

    def runs(self, prefix: str = "") -> list[RunRecord]:
        """Every finished run, by run id; only those whose id starts with ``prefix`` if given."""
        if not self.runs_dir.exists():
            return []
        out = []
        for path in sorted(self.runs_dir.glob(f"{glob.escape(prefix)}*/run.json")):
            try:
                out.append(_read_run(path))
            except InputError:
                if path.exists():
                    raise
                # renamed aside since the glob (reopen_failed_starts in another process): unfinished
        return out

    def reusable(self, run_id: str) -> bool:
        """Whether a probe would reuse this run: finished, and not failed before training."""
        record = self.run(run_id)
        return record is not None and not failed_before_training(record)

    def run(self, run_id: str) -> RunRecord | None:
        """One finished run's record, None if it has not finished."""
        path = self.run_dir(run_id) / "run.json"
        try:
            return _read_run(path) if path.exists() else None
        except InputError:
            if path.exists():
                raise
            return None  # renamed aside between the check and the read: unfinished again

    def steps(self, run_id: str) -> list[StepRecord]:
        """A run's steps; a sealed run's are checked against its record (records/check.py)."""
        path = self.run_dir(run_id) / "steps.jsonl"
        try:
            st = path.stat()
        except FileNotFoundError:
            check.check_missing_steps(self.run(run_id), path)
            return []
        steps = _decoded_steps(str(path), _version(st))
        check.check_steps(self.run(run_id), steps, path)
        return list(steps)

    def add_finished_run(self, record: RunRecord, steps: list[StepRecord]) -> bool:
        """Store a whole run at once (imports). Returns False if it was already there."""
        with self.claim(record.run_id) as writer:
            if writer is None:
                return False
            for step in steps:
                writer.append(step)
            writer.finish(record)
            return True

    # ---- throughput ----------------------------------------------------------------------
    @property
    def throughput_path(self) -> Path:
        return self.root / "throughput.jsonl"

    def append_throughput(self, points: list[ThroughputPoint]) -> None:
        if not points:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        text = "".join(to_json(p) + "\n" for p in points)
        path = self.throughput_path
        with naming(path), locked(self.root / ".throughput.lock"), open(path, "a") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    def throughput(self) -> list[ThroughputPoint]:
        path = self.throughput_path
        return [from_dict(ThroughputPoint, row, str(path)) for row in read_jsonl(path)]

    def _model_info_path(self, profile_id: str) -> Path:
        return self.root / "profiles" / f"{profile_id}.model.json"

    def write_model_info(self, profile_id: str, info: ModelInfo) -> None:
        """Store the profiled model's shape beside its throughput points."""
        atomic_write_text(self._model_info_path(profile_id), to_json(info) + "\n")

    def model_info(self, profile_id: str) -> ModelInfo | None:
        """The model shape stored with a profile; None for a profile stored without one."""
        path = self._model_info_path(profile_id)
        if not path.exists():
            return None
        return from_dict(ModelInfo, codec.loads(read_text(path), str(path)), str(path))

    def exists(self) -> bool:
        return self.manifest_path.exists() or self.runs_dir.exists() or self.throughput_path.exists()
