"""The records batchtune writes and reads, and the results store that holds them.

Layout of a results directory (documented in docs/formats.md)::

    manifest.json              the recipe the probe ran with (checked on resume)
    runs/<run_id>/steps.jsonl  one StepRecord per line, appended as training goes
    runs/<run_id>/run.json     the RunRecord, written atomically when the run ends
    throughput.jsonl           ThroughputPoint lines (generation and training timings)
    profiles/<id>.model.json   the ModelInfo (shape) of the model a profile measured
    plots/                     PNG figures

A run is finished exactly when its run.json exists. A run without one is redone from scratch on
resume; its stale steps file is kept beside it (renamed), so nothing is lost. Writers of one run hold
an exclusive lock on ``runs/<run_id>/.lock``, so two processes on one directory never write the same
run; appends to throughput.jsonl are single ``write`` calls under a lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import glob
import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from batchtune import codec, records_check
from batchtune.codec import from_dict
from batchtune.errors import InputError
from batchtune.store_paths import contained

RUN_STATUSES = (
    "reached_target",  # stopped because the target was reached
    "budget_exhausted",  # ran its whole sample budget without reaching the target (censored)
    "stopped_outside_band",  # stopped early: clearly slower than the reference (censored)
    "completed",  # an imported run: no stop reason known
    "diverged",  # NaN or exploding loss
    "oom",  # out of memory at this batch
    "failed",  # the backend raised; message says why
    "timeout",  # an external command ran past its timeout
)
FAILED_STATUSES = ("diverged", "oom", "failed", "timeout")


def failed_before_training(record: RunRecord) -> bool:
    """Whether a probe's run failed before its first training step, as its backend said
    (``RunFailed(started=False)``: a user's trainer command that exited before its log held a step,
    e.g. not installed or a config it refused). Such a run measured nothing, so it is not data: the
    analysis leaves it out and a rerun of the probe runs it again
    (``ResultsStore.reopen_failed_starts``). A run that diverged, ran out of memory, timed out, was
    lost on Ray, or failed after training steps, is data and is kept."""
    return record.status == "failed" and record.failed_start and record.source == "probe"


def candidate_label(prompts: int, group_size: int, *, fixed_lr: bool = False) -> str:
    """The one name of a candidate, e.g. ``P16xG8`` (``P16xG8-fixedlr`` for a fixed-LR control)."""
    return f"P{prompts}xG{group_size}" + ("-fixedlr" if fixed_lr else "")


_RL_LABEL = re.compile(r"P(\d+)xG(\d+)(-.+)?")  # candidate_label's shape
_TOKEN_LABEL = re.compile(r"B(\d+)")  # a pre-training candidate: B{tokens per step}


def _check_label(record: Any, path: Path) -> None:
    """A run.json whose label names another batch than its prompts and group_size would be analysed
    under the wrong candidate: refuse it. Labels of another shape (an import's own name) pass."""
    p, g, label = record.prompts, record.group_size, record.candidate
    rl, tok = _RL_LABEL.fullmatch(label), _TOKEN_LABEL.fullmatch(label)
    if (rl and (int(rl[1]), int(rl[2])) != (p, g)) or (tok and int(tok[1]) != p * g):
        raise InputError(
            f"{path}: candidate {label!r} disagrees with its prompts = {p} and group_size = {g}; "
            "fix the file or delete that run's folder to redo it"
        )


@dataclass(frozen=True)
class StepRecord:
    """One optimiser step of one run. Cumulative counters are totals since the run began."""

    run_id: str
    step: int
    samples: int  # responses consumed so far (RL) or tokens (pre-training)
    tokens: int  # generated (RL) or trained (pre-training) tokens so far
    lr: float  # actor LR used at this step, after warmup
    prompts: int  # P of the run
    group_size: int  # G of the run
    seed: int
    metrics: dict[str, float] = field(default_factory=dict)  # reward, eval_reward, loss, kl, ...
    grad_norm: float | None = None  # actor, before clipping
    critic_grad_norm: float | None = None  # PPO critic, before clipping
    gen_s: float = 0.0  # seconds generating this step's rollouts
    train_s: float = 0.0  # seconds in forward/backward/optimiser step
    other_s: float = 0.0  # reward, reference log-probs, evaluation

    @property
    def timed(self) -> bool:  # an imported log's evaluation-only entry carries no step times
        return self.gen_s + self.train_s + self.other_s > 0


@dataclass(frozen=True)
class RunRecord:
    """One training run of one candidate at one seed, written when it ends."""

    run_id: str
    candidate: str  # label shared by the seeds of one candidate, e.g. "P16xG8" or "P16xG8-fixedlr"
    prompts: int
    group_size: int
    seed: int
    lr: float  # the (peak) actor LR this run used
    lr_rule: str  # sqrt | linear | none | table | given (imported or explicit)
    base_lr: float
    reference_batch: int  # total responses that base_lr belongs to
    status: str
    reason: str = ""
    steps: int = 0
    samples: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    gen_s: float = 0.0
    train_s: float = 0.0
    other_s: float = 0.0
    critic_lr: float | None = None
    backend: str = ""
    source: str = "probe"  # probe | a file it was imported from
    finished_at: float = 0.0  # unix time
    # runs executing at once on this machine while this one ran (1 = alone); 0 = unknown (imported).
    # Step times of runs sharing cores are contended, so Θ read from them is biased (recommend warns).
    parallel_runs: int = 0
    cpu_cores: int = 0  # os.cpu_count() of the machine that ran it; 0 = unknown
    # the backend said no training step ran (backends.spec.RunFailed.started): not data, run again
    failed_start: bool = False
    staleness: int = 0  # k: rollouts from the weights of k trainer steps ago (issue 30; absent: on-policy)
    updates_per_batch: int = 1  # u: optimiser updates per rollout batch (mini-batches x epochs)

    @property
    def batch_responses(self) -> int:
        return self.prompts * self.group_size


@dataclass(frozen=True)
class ThroughputPoint:
    """One measured point of generation or training throughput."""

    kind: str  # generation | training
    backend: str
    mode: str  # generation: fixed (EOS ignored) | eos; training: train
    concurrency: int  # generation: responses in flight; training: batch in responses
    status: str = "ok"  # ok | oom | failed
    responses_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    step_latency_s: float = 0.0  # generation: time for the whole batch; training: step time
    step_latency_spread_s: float = 0.0  # (max - min) / 2 over repeats
    peak_mem_bytes: int = 0
    preemptions: int = 0
    queued: int = 0  # vLLM: most requests held waiting with its KV cache full (a memory ceiling)
    repeats: int = 0
    prompt_tokens: int = 0
    max_new_tokens: int = 0
    mean_output_tokens: float = 0.0
    model: str = ""
    hardware: str = ""
    message: str = ""
    profile_id: str = ""
    other_cores: float = math.nan  # CPU cores other processes kept busy while timed (NaN: unknown)
    cpu_cores: int = 0  # the machine's CPU cores (0: not recorded)


@dataclass(frozen=True)
class ModelInfo:
    """The profiled model's shape, stored with its profile so the roofline analysis never builds a model."""

    name: str
    n_params: float
    n_active_params: float
    bytes_per_param: float
    n_layers: int
    n_kv_heads: int
    head_dim: int


def to_json(record: Any) -> str:
    """One record as one line of JSON (the codec's NaN/inf convention)."""
    return codec.dumps(record, sort_keys=True)


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """A write's OSError names ``path``: EFBIG (file-size limit) and ENOSPC (disk full) raised by a
    file object's write or flush carry no filename, and the CLI's one-line message shows it."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with naming(path), open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read JSON lines; a torn last line (a crash mid-write) is skipped, any other bad line is an error."""
    if not path.exists():
        return []
    lines = _read_text(path).splitlines()
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(codec.loads(line, f"{path}:{i + 1}"))
        except InputError:
            if i == len(lines) - 1:
                break
            raise InputError(f"{path}:{i + 1} is not valid JSON") from None
    return rows


def _read_run(path: Path) -> RunRecord:
    data = codec.loads(_read_text(path), f"{path} (delete that run's folder to redo it)")
    record = from_dict(RunRecord, data, str(path))
    _check_label(record, path)
    records_check.check_run(record, path, RUN_STATUSES)  # run_id, status, counters
    return record


@functools.lru_cache(maxsize=512)
def _decoded_steps(path: str, mtime_ns: int, size: int) -> tuple[StepRecord, ...]:
    """A steps file's records, decoded once per version of the file (its mtime and size key the cache).

    A probe re-analyses its store after every round of extra seeds; without this it decoded every
    finished run's steps again each time, which was most of an NQM probe's wall time.
    """
    return tuple(from_dict(StepRecord, row, path) for row in read_jsonl(Path(path)))


@contextlib.contextmanager
def _locked(path: Path, blocking: bool = True) -> Iterator[bool]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


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
        data = codec.loads(_read_text(self.manifest_path), str(self.manifest_path))
        if not isinstance(data, dict):
            raise InputError(f"{self.manifest_path} is not a JSON object; move it away to start over")
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
        with _locked(run_dir / ".lock", blocking=False) as got:
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
            with _locked(run_dir / ".lock", blocking=False) as got:
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
        """A run's steps; a sealed run's are checked against its record (records_check.py)."""
        path = self.run_dir(run_id) / "steps.jsonl"
        try:
            st = path.stat()
        except FileNotFoundError:
            records_check.check_missing_steps(self.run(run_id), path)
            return []
        steps = _decoded_steps(str(path), st.st_mtime_ns, st.st_size)
        records_check.check_steps(self.run(run_id), steps, path)
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
        with naming(path), _locked(self.root / ".throughput.lock"), open(path, "a") as fh:
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
        return from_dict(ModelInfo, codec.loads(_read_text(path), str(path)), str(path))

    def exists(self) -> bool:
        return self.manifest_path.exists() or self.runs_dir.exists() or self.throughput_path.exists()
