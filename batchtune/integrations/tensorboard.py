"""TensorBoard event files (OpenRLHF, verl's tensorboard logger, most others).

Needs the ``tensorboard`` package (``pip install 'batchtune[tensorboard]'``), imported only here. Each
folder holding ``events.out.tfevents.*`` files is one run; its scalar tags become keys, the event
step is the trainer's step (one rollout batch for OpenRLHF and verl). When the log has no timing
tags, the wall-clock between consecutive logged steps (from the events' wall_time, per step) is
kept as ``tb/step_wall_s`` and used as the step time.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from batchtune.errors import InputError
from batchtune.integrations.common import ImportedRun, LogKeys, RunInfo, StepEntry, merge_keys
from batchtune.integrations.convert import build_run
from batchtune.integrations.openrlhf import OPENRLHF_KEYS
from batchtune.integrations.trl import TRL_KEYS
from batchtune.integrations.verl import VERL_KEYS

WALL_KEY = "tb/step_wall_s"
TENSORBOARD_KEYS = merge_keys(OPENRLHF_KEYS, VERL_KEYS, TRL_KEYS, LogKeys(step_s=(WALL_KEY,)))


def _event_dirs(path: Path) -> list[Path]:
    if path.is_file():  # a run's event file stands for its folder; another file for nothing
        if not path.name.startswith("events.out.tfevents."):
            raise InputError(
                f"{path} is not a TensorBoard event file (events.out.tfevents.*): give the run's "
                "folder or its event file"
            )
        return [path.parent]
    if not path.is_dir():
        raise InputError(f"{path}: no such file or folder")
    dirs = sorted({p.parent for p in path.rglob("events.out.tfevents.*") if p.is_file()})
    if not dirs:
        raise InputError(f"{path}: no TensorBoard event files (events.out.tfevents.*) in it")
    return dirs


def _load_scalars(folder: Path) -> dict[int, tuple[dict[str, float], float]]:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.util import tensor_util
    except ImportError:
        raise InputError(
            "reading TensorBoard logs needs the tensorboard package: pip install 'batchtune[tensorboard]'"
        ) from None
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    try:
        acc.Reload()
    except Exception as exc:  # corrupt or truncated event files surface as various errors
        raise InputError(f"{folder}: cannot read TensorBoard events ({type(exc).__name__}: {exc})") from None
    steps: dict[int, tuple[dict[str, float], float]] = {}

    def put(tag: str, step: int, wall: float, value: float) -> None:
        values, last_wall = steps.setdefault(step, ({}, 0.0))
        values[tag] = value
        steps[step] = (values, max(last_wall, wall))

    tags = acc.Tags()
    for tag in tags.get("scalars", []):
        for ev in acc.Scalars(tag):
            put(tag, int(ev.step), float(ev.wall_time), float(ev.value))
    for tag in tags.get("tensors", []):
        for ev in acc.Tensors(tag):
            arr = tensor_util.make_ndarray(ev.tensor_proto)
            if arr.size == 1 and arr.dtype.kind in "fiu":
                put(tag, int(ev.step), float(ev.wall_time), float(arr.reshape(-1)[0]))
    return steps


def read_tensorboard(path: str | Path, info: RunInfo, keys: LogKeys | None = None) -> list[ImportedRun]:
    """Read every run (event folder) under ``path``. ``info`` gives prompts and group_size per step."""
    path = Path(path)
    runs = []
    dirs = _event_dirs(path)
    for folder in dirs:
        steps = _load_scalars(folder)
        if not steps:
            raise InputError(f"{folder}: the event files hold no scalars")
        entries = []
        prev: tuple[int, float] | None = None
        for step in sorted(steps):
            values, wall = steps[step]
            if prev is not None and step > prev[0] and wall > prev[1]:
                values[WALL_KEY] = (wall - prev[1]) / (step - prev[0])
            prev = (step, wall)
            entries.append(StepEntry(step=step, values=values, where=f"{folder} step {step}"))
        rel = str(folder.relative_to(path)) if path.is_dir() and folder != path else folder.name
        run_info = info
        if len(dirs) > 1:  # one run per folder: their names must differ
            run_info = replace(info, run_id=f"{info.run_id}-{rel}" if info.run_id else rel)
        name = rel
        runs.append(build_run(entries, run_info, keys or TENSORBOARD_KEYS, str(folder), name))
    return runs
