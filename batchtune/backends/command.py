"""The ``command`` training backend: run the user's own trainer once per candidate and read its log.

``recipe.backend.command`` is an argv list (never a shell string) whose items may hold placeholders,
filled per run with ``str.format`` (write ``{{`` and ``}}`` for literal braces):

    {prompts} {group_size} {batch_responses}    P, G and N = P*G of the candidate
    {batch_responses_per_gpu}                   N / hardware.num_gpus
    {mini_batch_prompts} {mini_batch_responses} P and N / algorithm.mini_batches
    {lr} {critic_lr} {seed}                     scaled actor LR, critic LR (actor's if none), seed
    {max_samples} {max_steps} {max_prompts}     budget in responses, rollout steps, prompts
    {output_dir} {run_dir} {run_id} {num_gpus}  spec.run_dir / "output", spec.run_dir, ...

Checkpoints (branched probes, batch schedules; docs/branched.md "Your own trainer"): a run asked to
save gets ``backend.command_save_args`` appended ({save_every_steps}, {save_at_steps} in the
trainer's own steps, {checkpoint_dir}); when it exits, batchtune finds each checkpoint at
``backend.checkpoint_path`` (the same placeholders plus {step} and {samples}) and records it. A run
that starts from one gets ``backend.command_resume_args`` appended ({resume_from}: that path,
{resume_step}: the trainer's step there); its {max_steps} counts on from {resume_step}
(``backend.resume_steps = "continue"``) or from 0 ("restart"), and its logged steps are put on the
cumulative samples axis: samples = the checkpoint's + (steps since it) x this run's batch.

The command must write its metrics to ``backend.command_log`` (relative to {output_dir}; the same
placeholders) in ``backend.command_log_format``. Line formats (jsonl, csv, verl) are read while the
trainer runs and each step is yielded once the next one appears; the others after it exits. A
non-zero exit is a failed run (an out-of-memory message makes it ``oom``), ``backend.timeout_s`` a
timed-out one; closing the generator stops the whole process group. The command runs under
``lifeguard``'s guard, so it and its children also die when batchtune is killed (even by kill -9).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchtune.backends import lifeguard
from batchtune.backends.command_args import argv_templates, fill, placeholders
from batchtune.backends.command_checkpoints import (
    CHECKPOINT_META,
    Origin,
    on_samples_axis,
    origin,
    trainer_step,
)
from batchtune.backends.spec import OutOfMemory, RunFailed, RunSpec, checkpoint_path
from batchtune.errors import BatchtuneError, RecipeError
from batchtune.integrations.common import RunInfo
from batchtune.integrations.readers import STREAMABLE, read_log
from batchtune.records.files import atomic_write_text
from batchtune.records.types import StepRecord

POLL_S = 0.2  # how often the log and the process are checked
KILL_GRACE_S = 5.0  # SIGTERM -> SIGKILL
_OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda error: out of memory")


# "ValueError: ...", "torch.OutOfMemoryError: ...": a Python exception's last line
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def _stderr_tail(path: Path, lines: int = 3) -> str:
    """Why the command failed: its last exception line when it printed one (a launcher such as
    accelerate or torchrun re-raises the trainer's error as a CalledProcessError carrying the whole
    argv, so the trainer's own line is the one that says why), else its last ``lines`` lines."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()]
    own = [ln for ln in kept if _EXCEPTION_LINE.match(ln) and "CalledProcessError" not in ln]
    if own:
        return own[-1][:600]
    return " | ".join(kept[-lines:])[-600:]


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _stop(proc: subprocess.Popen) -> None:
    """Stop the command and everything it started (it runs under the lifeguard in its own session),
    also when the command itself has already exited but left children behind."""
    try:
        if proc.poll() is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            return
        for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S + 1), (signal.SIGKILL, KILL_GRACE_S)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait_s)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # anything the guard's SIGTERM left
                return
            except subprocess.TimeoutExpired:
                continue
    finally:
        lifeguard.unregister_group(proc.pid)


@dataclass(frozen=True)
class _Launch:
    """One run's command, filled in: what starts it and where its output goes."""

    argv: list[str]
    env: dict[str, str]
    values: dict[str, Any]  # the placeholders' values (the checkpoint path is filled from them)
    log_path: Path
    info: RunInfo  # what the log reader is told about the run
    stdout_path: Path
    stderr_path: Path


def _run_info(spec: RunSpec) -> RunInfo:
    c, fmt = spec.candidate, spec.recipe.backend.command_log_format
    return RunInfo(
        prompts=c.prompts,
        group_size=c.group_size,
        lr=c.lr,
        seed=spec.seed,
        critic_lr=c.critic_lr or 0.0,
        run_id=spec.run_id,
        candidate=c.label,
        # TRL logs optimiser steps: with mini-batches one generation feeds several of them
        samples_per_step=c.batch_responses // spec.recipe.algorithm.mini_batches if fmt == "trl" else 0,
    )


def _launch(spec: RunSpec, start: Origin) -> _Launch:
    """The filled argv and environment; a fresh output folder (an interrupted earlier attempt's is
    kept aside, its log never read)."""
    cfg = spec.recipe.backend
    values = placeholders(spec, start)
    saves = any(x > start.samples for x in spec.save_at_samples)
    templates = argv_templates(cfg, save=saves, resume=spec.resume_from is not None)
    argv = [fill(item, values, where) for where, item in templates]
    env = dict(os.environ)
    env.update({k: fill(v, values, f"backend.command_env.{k}") for k, v in cfg.command_env.items()})
    output_dir = Path(values["output_dir"])
    if output_dir.exists() and any(output_dir.iterdir()):
        output_dir.rename(output_dir.with_name(f"{output_dir.name}.stale-{time.time_ns()}"))
    output_dir.mkdir(parents=True, exist_ok=True)
    return _Launch(
        argv=argv,
        env=env,
        values=values,
        log_path=output_dir / fill(cfg.command_log, values, "backend.command_log"),
        info=_run_info(spec),
        stdout_path=spec.run_dir / "command.stdout",
        stderr_path=spec.run_dir / "command.stderr",
    )


def _start(spec: RunSpec, launch: _Launch) -> subprocess.Popen:
    """Start the command under the lifeguard, which stops its whole group when batchtune dies, even
    by kill -9."""
    argv = launch.argv
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    with open(launch.stdout_path, "wb") as out, open(launch.stderr_path, "wb") as err:
        if shutil.which(argv[0]) is None:
            raise RunFailed("failed", f"cannot start {argv[0]!r}: not found or not executable")
        try:
            return lifeguard.start_guarded(
                argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=launch.env
            )
        except OSError as exc:
            raise RunFailed("failed", f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None


def _read(spec: RunSpec, launch: _Launch, start: Origin, partial: bool) -> list[StepRecord]:
    """The run's steps so far; while running, a missing or half-written log reads as no steps."""
    path, info, keys = launch.log_path, launch.info, spec.recipe.backend.command_log_keys
    if partial and not path.exists():
        return []
    try:
        runs = read_log(path, spec.recipe.backend.command_log_format, info, keys or None, partial=partial)
    except BatchtuneError as exc:
        if partial:
            return []
        raise RunFailed("failed", f"cannot read the command's log: {exc}") from None
    if partial and not runs:
        return []
    if len(runs) != 1:
        raise RunFailed("failed", f"the command's log {path} holds {len(runs)} runs; expected one")
    run = runs[0]
    if (run.prompts, run.group_size) != (info.prompts, info.group_size):
        raise RunFailed(
            "failed",
            f"the log says P={run.prompts} x G={run.group_size}, the candidate is "
            f"P={info.prompts} x G={info.group_size}: check the command's placeholders",
        )
    steps = [dataclasses.replace(s, run_id=spec.run_id, seed=spec.seed) for s in run.steps]
    return on_samples_axis(steps, spec, start, partial)


def _record_checkpoints(
    spec: RunSpec, values: dict[str, Any], start: Origin, reached: int, strict: bool = True
) -> None:
    """Find each checkpoint the trainer was asked for, up to ``reached`` samples, and record where it
    lies. ``strict``: a missing one fails the run (after a clean exit); else it is skipped."""
    if not spec.save_at_samples:
        return
    cfg = spec.recipe.backend
    n = spec.candidate.batch_responses
    assert spec.checkpoint_dir is not None, "save_at_samples needs a checkpoint_dir"
    for at in sorted(x for x in spec.save_at_samples if start.samples < x <= reached):
        step = trainer_step(start, at, n, cfg.resume_steps)
        assert step is not None  # placeholders() refused saves inside a step
        at_step = {**values, "step": step, "samples": at}
        where = Path(fill(cfg.checkpoint_path, at_step, "backend.checkpoint_path"))
        if not where.exists():
            if not strict:
                continue
            raise RunFailed(
                "failed",
                f"the trainer wrote no checkpoint at its step {step} ({at} samples): expected "
                f"{where} (backend.checkpoint_path); check backend.command_save_args",
            )
        meta = {"samples": at, "step": step, "path": str(where.resolve()), "lr": spec.candidate.lr}
        atomic_write_text(checkpoint_path(spec.checkpoint_dir, at) / CHECKPOINT_META, json.dumps(meta))


class _Yielded:
    """The steps a run has yielded: the last one's number, and the samples of the last streamed."""

    def __init__(self) -> None:
        self.step = -1
        self.streamed_samples = 0

    def new(self, steps: list[StepRecord]) -> Iterator[StepRecord]:
        """The steps past the last one yielded, marked yielded as they go."""
        for step in steps:
            if step.step > self.step:
                self.step = step.step
                yield step


def _while_running(
    proc: subprocess.Popen, spec: RunSpec, launch: _Launch, start: Origin, seen: _Yielded
) -> Iterator[StepRecord]:
    """Stream a line-format log's steps while the command runs (the last step may still get lines);
    stop it past ``backend.timeout_s``."""
    cfg = spec.recipe.backend
    started = time.monotonic()
    seen_stat: tuple[int, int] | None = None  # (size, mtime) of the log when last read
    while proc.poll() is None:
        if cfg.timeout_s and time.monotonic() - started > cfg.timeout_s:
            _stop(proc)
            raise RunFailed(
                "timeout", f"ran past backend.timeout_s = {cfg.timeout_s:g} s; see {launch.stderr_path}"
            )
        stat = _stat(launch.log_path)
        if cfg.command_log_format in STREAMABLE and stat is not None and stat != seen_stat:
            seen_stat = stat
            for step in seen.new(_read(spec, launch, start, partial=True)[:-1]):
                seen.streamed_samples = step.samples
                yield step
        time.sleep(POLL_S)


def _failed(rc: int, spec: RunSpec, launch: _Launch, start: Origin, seen: _Yielded) -> Iterator[StepRecord]:
    """A non-zero exit: the steps it trained before it failed are data, yielded, then the run fails
    (``oom`` when its stderr says out of memory)."""
    tail = _stderr_tail(launch.stderr_path)
    msg = f"command exited with code {rc}" + (f": {tail}" if tail else "")
    if any(m in tail.lower() for m in _OOM_MARKERS):
        raise OutOfMemory(msg)
    try:
        trained = _read(spec, launch, start, partial=True)
    except Exception:  # noqa: BLE001 - a log cut mid-write: the steps streamed stand
        trained = []
    yield from seen.new(trained)
    raise RunFailed("failed", msg, started=bool(trained) or seen.step > 0)


class CommandBackend:
    """Runs ``recipe.backend.command`` per candidate; see the module docstring."""

    name = "command"

    @staticmethod
    def checkpoint_support(recipe: Any) -> str | None:
        """None when the recipe says how its trainer saves and resumes, else what is missing."""
        cfg = recipe.backend
        missing = [
            key
            for key, value in (
                ("backend.checkpoint_path", cfg.checkpoint_path),
                ("backend.command_save_args", cfg.command_save_args),
                ("backend.command_resume_args", cfg.command_resume_args),
            )
            if not value
        ]
        if not missing:
            return None
        return (
            f"the command training backend cannot start from a checkpoint until the recipe sets "
            f"{', '.join(missing)} (docs/branched.md shows them for verl, TRL and OpenRLHF)"
        )

    def train(self, spec: RunSpec) -> Iterator[StepRecord]:
        cfg = spec.recipe.backend
        if not cfg.command:
            raise RecipeError("backend.command: the command backend needs an argv list")
        if not cfg.command_log:
            raise RecipeError("backend.command_log: say which file the command writes its metrics to")
        if spec.save_at_samples or spec.resume_from is not None:
            problem = self.checkpoint_support(spec.recipe)
            if problem is not None:
                raise RecipeError(problem)
        start = origin(spec)  # read once: the polling loop reuses it
        launch = _launch(spec, start)
        proc = _start(spec, launch)
        seen = _Yielded()
        clean_exit = False
        try:
            yield from _while_running(proc, spec, launch, start, seen)
            if proc.returncode != 0:
                yield from _failed(proc.returncode, spec, launch, start, seen)
            steps = _read(spec, launch, start, partial=False)
            if not steps:
                raise RunFailed(
                    "failed",
                    f"the command finished but its log {launch.log_path} holds no steps",
                    started=False,
                )
            _record_checkpoints(spec, launch.values, start, max(s.samples for s in steps))
            clean_exit = True
            yield from seen.new(steps)
        finally:
            _stop(proc)
            if not clean_exit and seen.streamed_samples > start.samples:
                # stopped early (the caller closed us at its budget or target): record the checkpoints
                # of the steps already streamed, whose saves the trainer finished before logging on
                _record_checkpoints(spec, launch.values, start, seen.streamed_samples, strict=False)
