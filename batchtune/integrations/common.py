"""The shapes shared by the log readers: what a run imported from a log looks like and which log
keys mean what. Pure Python, no torch.

An imported run becomes a RunRecord (status "completed", or "diverged": ``divergence``; lr_rule
"given") plus StepRecords, so it is
analysed exactly like a probe run. Samples are responses (docs/method.md §2): a log that counts optimiser
steps is converted with ``samples = step * prompts * group_size`` unless it logs samples itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from batchtune.errors import InputError
from batchtune.records.types import RunRecord, StepRecord

# ---- what the log may not say ---------------------------------------------------------------------


@dataclass(frozen=True)
class RunInfo:
    """Facts about a run that its log may not record. Log columns win where a format has them."""

    prompts: int = 0  # P per rollout batch (verl: data.train_batch_size); 0 = the log must say
    group_size: int = 0  # G (verl: rollout.n, TRL: num_generations); 0 = the log must say
    lr: float = 0.0  # peak actor LR; 0 = the largest LR the log reports
    seed: int = 0
    critic_lr: float = 0.0  # PPO critic LR; 0 = unknown
    run_id: str = ""  # "" = from the run column, the file or the folder name
    candidate: str = ""  # "" = "P{prompts}xG{group_size}", the probe's label
    # responses consumed per logged step; 0 = prompts * group_size (one rollout batch per step). TRL
    # counts optimiser steps, which see fewer when one generation feeds several of them.
    samples_per_step: int = 0
    # off-policy settings the run was launched with (the log says what it reached, as "staleness"):
    # k in trainer steps and optimiser updates per rollout batch, stored on its RunRecord
    staleness: int = 0
    updates_per_batch: int = 1


# ---- which log key means what ---------------------------------------------------------------------

# Fields of LogKeys a user may override with "name=KEY"; any other name is a metric alias.
KEY_FIELDS = ("grad_norm", "critic_grad_norm", "lr", "gen_s", "train_s", "step_s", "response_length")


@dataclass(frozen=True)
class LogKeys:
    """Trainer log keys behind batchtune's names. Each entry lists alternatives (exact keys or
    ``fnmatch`` globs); the first one present in a run is used. ``gen_s`` and ``train_s`` instead sum
    every listed key present (verl logs the actor and critic updates separately).

    ``metrics`` maps batchtune metric names (``reward``, ``eval_reward``, what ``target.metric``
    names) to trainer keys. With ``keep_all`` every other numeric key is kept under its own name too.
    Names in ``required`` came from the user: a missing or ambiguous key is then an error, while a
    default that does not match is skipped.
    """

    metrics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    grad_norm: tuple[str, ...] = ()  # actor, before clipping
    critic_grad_norm: tuple[str, ...] = ()
    lr: tuple[str, ...] = ()  # actor LR at the step
    gen_s: tuple[str, ...] = ()  # seconds generating (summed)
    train_s: tuple[str, ...] = ()  # seconds updating (summed)
    step_s: tuple[str, ...] = ()  # whole step; other_s = step_s - gen_s - train_s
    response_length: tuple[str, ...] = ()  # mean generated tokens per response
    keep_all: bool = True
    required: frozenset[str] = frozenset()

    def override(self, mapping: Mapping[str, str] | None) -> LogKeys:
        """Apply user ``name=KEY`` pairs; ``gen_s``/``train_s`` take comma-separated keys."""
        if not mapping:
            return self
        changes: dict[str, object] = {}
        metrics = dict(self.metrics)
        for name, key in mapping.items():
            if not key:
                raise InputError(f"key mapping {name}=: empty key; write {name}=LOG_KEY")
            if name in KEY_FIELDS:
                keys = tuple(k.strip() for k in key.split(",")) if name in ("gen_s", "train_s") else (key,)
                changes[name] = keys
            else:
                metrics[name] = (key,)
        return replace(self, metrics=metrics, required=self.required | set(mapping), **changes)  # type: ignore[arg-type]


def merge_keys(*keysets: LogKeys) -> LogKeys:
    """Alternatives of several trainers in order (for formats any trainer can write: TensorBoard, W&B)."""

    def cat(values: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
        out: list[str] = []
        for v in values:
            out.extend(k for k in v if k not in out)
        return tuple(out)

    names: list[str] = []
    for ks in keysets:
        names.extend(n for n in ks.metrics if n not in names)
    return LogKeys(
        metrics={n: cat(ks.metrics.get(n, ()) for ks in keysets) for n in names},
        **{f: cat(getattr(ks, f) for ks in keysets) for f in KEY_FIELDS},  # type: ignore[arg-type]
    )


# ---- imported runs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImportedRun:
    """One run read from a trainer's log, ready to store like a probe run."""

    run_id: str
    candidate: str
    prompts: int
    group_size: int
    seed: int
    lr: float  # peak actor LR
    steps: tuple[StepRecord, ...]
    source: str  # the file it came from
    critic_lr: float | None = None
    staleness: int = 0  # RunInfo's: the k and u the run was launched with
    updates_per_batch: int = 1

    @property
    def batch_responses(self) -> int:
        return self.prompts * self.group_size

    @property
    def imported(self) -> bool:  # read from a log, as RunRecord.imported says of its stored record
        return True

    def to_records(self, backend: str = "import") -> tuple[RunRecord, list[StepRecord]]:
        last = self.steps[-1]
        # a timed entry's timings are per step, and it may stand for several (TRL's logging_steps):
        # each counts for the steps since the timed entry before it (an evaluation-only entry in
        # between carries no timings and stands for none)
        timed = [s for s in self.steps if s.timed]
        covers: list[int] = []
        for i, s in enumerate(timed):
            if i:
                covers.append(max(1, s.step - timed[i - 1].step))
            else:  # the first: up to the gap to the next (a log may start mid-run: a resumed one)
                gap = timed[1].step - s.step if len(timed) > 1 else 1
                covers.append(max(1, min(s.step, gap)))
        gen_s = sum(k * s.gen_s for k, s in zip(covers, timed, strict=True))
        train_s = sum(k * s.train_s for k, s in zip(covers, timed, strict=True))
        other_s = sum(k * s.other_s for k, s in zip(covers, timed, strict=True))
        diverged = divergence(self.steps)
        record = RunRecord(
            run_id=self.run_id,
            candidate=self.candidate,
            prompts=self.prompts,
            group_size=self.group_size,
            seed=self.seed,
            lr=self.lr,
            lr_rule="given",
            base_lr=self.lr,
            reference_batch=self.batch_responses,
            status="diverged" if diverged else "completed",
            reason=diverged or "",
            steps=max(sum(1 for s in self.steps if s.step > 0), last.step),  # not verl's step 0
            samples=last.samples,
            tokens=last.tokens,
            wall_s=gen_s + train_s + other_s,
            gen_s=gen_s,
            train_s=train_s,
            other_s=other_s,
            critic_lr=self.critic_lr,
            backend=backend,
            source=self.source,
            staleness=self.staleness,
            updates_per_batch=self.updates_per_batch,
        )
        return record, list(self.steps)


def divergence(steps: Sequence[StepRecord]) -> str | None:
    """Why a logged run counts as diverged, as a probe run that diverged does (records.types.FAILED_STATUSES:
    left out of every estimate and bound, reported as a failure): its gradient norm, or a metric it
    logged finite before, is nan or inf at a step and at every later step that logs it, to the end
    of the log. A lone non-finite value that a later step recovers from (an fp16 loss-scale skip) is
    not a divergence. None: the run did not diverge."""
    first: dict[str, tuple[int, float]] = {}  # key -> (step, value) of a non-finite run still open
    finite: set[str] = set()
    for s in steps:
        values = dict(s.metrics)
        for name, g in (("grad_norm", s.grad_norm), ("critic_grad_norm", s.critic_grad_norm)):
            if g is not None:
                values[name] = g
        for key, x in values.items():
            if math.isfinite(x):
                finite.add(key)
                first.pop(key, None)
            elif key in finite or key.endswith("grad_norm"):
                first.setdefault(key, (s.step, x))
    if not first:
        return None
    key, (step, x) = min(first.items(), key=lambda kv: kv[1][0])
    return f"{key} is {x} from step {step} to the end of the log"


@dataclass(frozen=True)
class StepEntry:
    """One logged step before conversion: the trainer's keys and values as read."""

    step: int
    values: dict[str, float]
    where: str  # file:line, for error messages
    samples: int | None = None  # when the log counts samples itself


def safe_run_id(text: str) -> str:
    """A run id usable as a folder name."""
    out = re.sub(r"[^A-Za-z0-9._=+-]+", "-", text).strip("-.")
    return out or "run"


def as_number(value: object) -> float | None:
    """A finite-or-not float from a JSON/CSV value, or None if it is not a number (bools are not)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        try:
            return float(text)
        except ValueError:
            return None
    return None


def merge_by_step(entries: Iterable[StepEntry]) -> list[StepEntry]:
    """Entries of the same step merged (later values win), sorted by step."""
    merged: dict[int, StepEntry] = {}
    for e in entries:
        old = merged.get(e.step)
        if old is None:
            merged[e.step] = StepEntry(e.step, dict(e.values), e.where, e.samples)
        else:
            old.values.update(e.values)
            merged[e.step] = StepEntry(
                e.step, old.values, e.where, e.samples if e.samples is not None else old.samples
            )
    return [merged[k] for k in sorted(merged)]
