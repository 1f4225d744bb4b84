"""Checks that a sealed run in a results directory is the run batchtune wrote (issue 33 item 4).

A sealed run (its ``run.json`` exists) is never rerun, so a record edited, copied or cut short by
hand or by a broken copy would silently change the fit. Each check below refuses such a run in one
line naming the file (InputError, exit 2), and says how to redo it:

- ``run.json``: its candidate label names its own prompts and group size, its ``run_id`` is its
  folder's name, its ``status`` one of ``RUN_STATUSES``, and its counters (steps, samples, tokens,
  seconds) are finite and not negative, its staleness >= 0 and updates per batch >= 1 (the ones
  a ``-k{k}u{u}`` label names);
- ``steps.jsonl`` of a sealed run: present when the record counts steps; every step's samples and
  tokens are not negative; steps never go backwards and no line is repeated (a probe's runs log one
  line per optimiser step, so their step numbers rise strictly); and its last line is where the
  record says the run ended (``samples``), so a truncated file is caught.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from batchtune.errors import InputError
from batchtune.records.types import OFFPOLICY_SUFFIX, PROBE_LABEL, RUN_STATUSES, RunRecord, StepRecord

_REDO = "restore it or delete that run's folder to redo the run"
_COUNTS = ("steps", "samples", "tokens")
_SECONDS = ("wall_s", "gen_s", "train_s", "other_s")
_TOKEN_LABEL = re.compile(r"B(\d+)")  # a pre-training candidate: B{tokens per step}


def check_label(record: RunRecord, path: Path) -> None:
    """A run.json whose label names another batch than its prompts and group_size would be analysed
    under the wrong candidate: refuse it. Labels of another shape (an import's own name) pass."""
    p, g, label = record.prompts, record.group_size, record.candidate
    rl, tok = PROBE_LABEL.fullmatch(label), _TOKEN_LABEL.fullmatch(label)
    if (rl and (int(rl[1]), int(rl[2])) != (p, g)) or (tok and int(tok[1]) != p * g):
        raise InputError(
            f"{path}: candidate {label!r} disagrees with its prompts = {p} and group_size = {g}; "
            "fix the file or delete that run's folder to redo it"
        )


def check_run(record: RunRecord, path: Path) -> None:
    """Refuse a ``run.json`` (at ``path``) that is not its folder's sealed run."""
    check_label(record, path)
    folder = path.parent.name
    if record.run_id != folder:
        raise InputError(
            f"{path}: run_id {record.run_id!r} is not its folder's name {folder!r} (a copied or "
            f"edited run.json); {_REDO}"
        )
    if record.status not in RUN_STATUSES:
        raise InputError(
            f"{path}: unknown status {record.status!r} (one of {', '.join(RUN_STATUSES)}); {_REDO}"
        )
    for name in _COUNTS:
        if getattr(record, name) < 0:
            raise InputError(f"{path}: {name} = {getattr(record, name)} is negative; {_REDO}")
    for name in _SECONDS:
        value = getattr(record, name)
        if not (math.isfinite(value) and value >= 0):
            raise InputError(f"{path}: {name} = {value!r} is not a time (>= 0 seconds); {_REDO}")
    check_knobs(record, path)


def check_knobs(record: RunRecord, path: Path) -> None:
    """The off-policy knobs a run was trained at: staleness k >= 0, updates per batch u >= 1, and
    the ones its ``-k{k}u{u}`` label names (else the run is ranked under another candidate's knobs)."""
    k, u = record.staleness, record.updates_per_batch
    if k < 0 or u < 1:
        raise InputError(
            f"{path}: staleness = {k} and updates_per_batch = {u}: a run has k >= 0 and u >= 1; {_REDO}"
        )
    named = OFFPOLICY_SUFFIX.search(record.candidate)
    if named and (int(named[1]), int(named[2])) != (k, u):
        raise InputError(
            f"{path}: candidate {record.candidate!r} disagrees with its staleness = {k} and "
            f"updates_per_batch = {u}; {_REDO}"
        )


def check_missing_steps(record: RunRecord | None, steps_path: Path) -> None:
    """A sealed run that counts steps has its steps file."""
    if record is not None and (record.steps > 0 or record.samples > 0):
        raise InputError(
            f"{steps_path} is missing, but the sealed run.json beside it counts {record.steps} steps "
            f"and {record.samples} samples; {_REDO}"
        )


def check_steps(record: RunRecord | None, steps: Sequence[StepRecord], steps_path: Path) -> None:
    """The steps of a sealed run (``record``; None: not sealed, only the counters are checked) are
    whole, in order, once each, and end where the record says."""
    strict = record is not None and not record.imported
    prev: StepRecord | None = None
    for i, s in enumerate(steps):  # run on every read of a run: a message is worded only on failure
        if s.samples < 0 or s.tokens < 0 or s.step < 0:
            where = f"{steps_path}: step record {i + 1}"
            raise InputError(f"{where} has negative counters (step {s.step}, samples {s.samples}); {_REDO}")
        if prev is not None:
            if s.step == prev.step and s.samples == prev.samples and s == prev:  # cheap tests first
                where = f"{steps_path}: step record {i + 1}"
                raise InputError(f"{where} repeats the line before it (step {s.step}); {_REDO}")
            if s.step < prev.step or s.samples < prev.samples or (strict and s.step == prev.step):
                where = f"{steps_path}: step record {i + 1}"
                raise InputError(
                    f"{where} goes back or repeats (step {s.step} at {s.samples} samples after step "
                    f"{prev.step} at {prev.samples}); {_REDO}"
                )
        prev = s
    if record is None:
        return
    last = steps[-1].samples if steps else 0
    if last != record.samples:
        raise InputError(
            f"{steps_path} ends at {last} samples, but the sealed run.json says the run ended at "
            f"{record.samples} (a truncated or edited file); {_REDO}"
        )
