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
import math
import os
import re
import shutil
import signal
import string
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchtune.backends import lifeguard
from batchtune.backends.spec import OutOfMemory, RunFailed, RunSpec, checkpoint_path
from batchtune.errors import BatchtuneError, RecipeError
from batchtune.integrations.common import RunInfo
from batchtune.integrations.readers import STREAMABLE, read_log
from batchtune.records import StepRecord, atomic_write_text

POLL_S = 0.2  # how often the log and the process are checked
KILL_GRACE_S = 5.0  # SIGTERM -> SIGKILL
_OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda error: out of memory")


CHECKPOINT_META = "batchtune-checkpoint.json"  # in <checkpoint_dir>/ckpt-<samples>/: where it lies


@dataclass(frozen=True)
class Origin:
    """Where a run starts: from scratch, or a checkpoint taken after ``samples`` cumulative samples
    at the trainer's own step ``step``, lying at ``path``."""

    samples: int = 0
    step: int = 0
    path: str = ""
    lr: float = 0.0  # the LR of the run that saved it (0: not recorded)

    def base_step(self, mode: str) -> int:
        """The trainer's step count from which this run's steps count: the checkpoint's when the
        trainer goes on counting (``resume_steps = "continue"``), 0 when it restarts."""
        return self.step if mode == "continue" else 0


def origin(spec: RunSpec) -> Origin:
    if spec.resume_from is None:
        return Origin()
    meta = Path(spec.resume_from) / CHECKPOINT_META
    try:
        d = json.loads(meta.read_text())
        return Origin(int(d["samples"]), int(d["step"]), str(d["path"]), float(d.get("lr", 0.0)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunFailed("failed", f"cannot read the checkpoint record {meta}: {exc}") from None


def _check_resumed_lr(logged: list[float], lr: float, start: Origin) -> None:
    """Fail a resumed run whose trainer logs the LR of the run that saved the checkpoint at every
    step instead of its own: its checkpoint restored the LR scheduler (verl's 'extra' content, TRL's
    scheduler.pt, OpenRLHF's DeepSpeed state), so a branch at 2x the batch trains at the trunk's LR
    and its ratio measures the wrong thing. Only an LR the log states counts (else the run's own is
    recorded); a fresh warmup passes the trunk's LR on one step, not on all of them."""
    if start.lr <= 0 or abs(lr - start.lr) <= 0.01 * lr:
        return
    if not logged or any(abs(x - start.lr) > 1e-4 * start.lr for x in logged):
        return
    last = logged[-1]
    raise RunFailed(
        "failed",
        f"the trainer logs lr {last:.4g} after resuming, the checkpoint's, not this run's {lr:.4g}: "
        "the checkpoint restored its LR scheduler; resume the model and optimiser only "
        "(backend.command_resume_args; docs/branched.md, 'Your own trainer')",
    )


def trainer_step(start: Origin, samples: int, batch: int, mode: str) -> int | None:
    """The trainer's own step count after ``samples`` cumulative samples (None: not a whole step)."""
    k, rem = divmod(samples - start.samples, batch)
    if rem:
        return None
    return start.base_step(mode) + k


def placeholders(spec: RunSpec, start: Origin | None = None) -> dict[str, Any]:
    """The values the argv, log path and environment templates may use (``start``: the run's
    origin when the caller has read it already)."""
    c, r = spec.candidate, spec.recipe
    n = c.batch_responses
    mb = r.algorithm.mini_batches
    start = start or origin(spec)
    mode = r.backend.resume_steps
    max_steps = start.base_step(mode) + max(1, math.ceil((r.budget.max_samples - start.samples) / n))
    saves = [trainer_step(start, x, n, mode) for x in sorted(spec.save_at_samples) if x > start.samples]
    whole = [x for x in saves if x is not None]
    gpus = r.hardware.num_gpus
    output_dir = spec.run_dir / "output"
    values: dict[str, Any] = {
        "prompts": c.prompts,
        "group_size": c.group_size,
        "batch_responses": n,
        "batch_responses_per_gpu": n // gpus if n % gpus == 0 else None,
        "mini_batch_prompts": c.prompts // mb if c.prompts % mb == 0 else None,
        "mini_batch_responses": n // mb if n % mb == 0 else None,
        "lr": repr(float(c.lr)),
        "critic_lr": repr(float(c.critic_lr if c.critic_lr is not None else c.lr)),
        "seed": spec.seed,
        "max_samples": r.budget.max_samples,
        "max_steps": max_steps,
        "max_prompts": max_steps * c.prompts,
        "output_dir": str(output_dir),
        "run_dir": str(spec.run_dir),
        "run_id": spec.run_id,
        "num_gpus": gpus,
        "checkpoint_dir": str(spec.checkpoint_dir or spec.run_dir / "checkpoints"),
        "resume_from": start.path,
        "resume_step": start.step,
        # None (an error naming the placeholder, if used) when a save falls inside a step
        "save_at_steps": ",".join(map(str, whole)) if len(whole) == len(saves) else None,
        # trainers save when their own step count is a multiple of it (verl, TRL, OpenRLHF)
        "save_every_steps": math.gcd(*whole) if saves and len(whole) == len(saves) else None,
    }
    return values


def fill(template: str, values: dict[str, Any], where: str) -> str:
    """``template`` with placeholders filled; a clear error for unknown or inexpressible ones."""
    try:
        parsed = [(f, spec or "") for _, f, spec, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise RecipeError(f"{where}: {template!r}: {exc} (write {{{{ and }}}} for literal braces)") from None
    for name, spec in parsed:
        if any(len(w) > 3 for w in re.findall(r"\d+", spec)):  # {lr:>300000000} would fill gigabytes
            raise RecipeError(f"{where}: {{{name}:{spec}}}: a width or precision above 999")
        if name not in values:
            raise RecipeError(f"{where}: unknown placeholder {{{name}}}; known: {', '.join(sorted(values))}")
        if values[name] is None:
            raise RunFailed("failed", f"{where}: {{{name}}} is not a whole number for this candidate")
    return template.format(**values)


def argv_templates(cfg: Any, *, save: bool, resume: bool) -> list[tuple[str, str]]:
    """(recipe key, template) of each argv item: the command, then the save and resume args."""
    out = [(f"backend.command[{i}]", t) for i, t in enumerate(cfg.command)]
    if save:
        out += [(f"backend.command_save_args[{i}]", t) for i, t in enumerate(cfg.command_save_args)]
    if resume:
        out += [(f"backend.command_resume_args[{i}]", t) for i, t in enumerate(cfg.command_resume_args)]
    return out


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
        start = origin(spec)  # read once: the polling loop below reuses it
        values = placeholders(spec, start)
        saves = any(x > start.samples for x in spec.save_at_samples)
        templates = argv_templates(cfg, save=saves, resume=spec.resume_from is not None)
        argv = [fill(item, values, where) for where, item in templates]
        env = dict(os.environ)
        env.update({k: fill(v, values, f"backend.command_env.{k}") for k, v in cfg.command_env.items()})
        output_dir = Path(values["output_dir"])
        if output_dir.exists() and any(output_dir.iterdir()):
            # an interrupted earlier attempt of this run: keep it aside, never read its log
            output_dir.rename(output_dir.with_name(f"{output_dir.name}.stale-{time.time_ns()}"))
        output_dir.mkdir(parents=True, exist_ok=True)
        log_path = output_dir / fill(cfg.command_log, values, "backend.command_log")
        fmt = cfg.command_log_format
        c = spec.candidate
        info = RunInfo(
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
        stdout_path, stderr_path = spec.run_dir / "command.stdout", spec.run_dir / "command.stderr"
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            if shutil.which(argv[0]) is None:
                raise RunFailed("failed", f"cannot start {argv[0]!r}: not found or not executable")
            try:
                # the lifeguard stops the command's whole group when batchtune dies, even by kill -9
                proc = lifeguard.start_guarded(
                    argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env
                )
            except OSError as exc:
                raise RunFailed("failed", f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
        started = time.monotonic()
        yielded = -1  # the last step yielded
        yielded_samples = 0  # its cumulative samples
        clean_exit = False
        seen_stat: tuple[int, int] | None = None  # (size, mtime) of the log when last read
        try:
            while True:
                rc = proc.poll()
                if rc is None and cfg.timeout_s and time.monotonic() - started > cfg.timeout_s:
                    _stop(proc)
                    raise RunFailed(
                        "timeout", f"ran past backend.timeout_s = {cfg.timeout_s:g} s; see {stderr_path}"
                    )
                if rc is None:
                    stat = _stat(log_path)
                    if fmt in STREAMABLE and stat is not None and stat != seen_stat:
                        seen_stat = stat
                        keys = cfg.command_log_keys
                        so_far = self._read(log_path, fmt, info, keys, spec, start, partial=True)
                        for step in so_far[:-1]:  # the last step may still get lines
                            if step.step > yielded:
                                yielded, yielded_samples = step.step, step.samples
                                yield step
                    time.sleep(POLL_S)
                    continue
                if rc != 0:
                    tail = _stderr_tail(stderr_path)
                    msg = f"command exited with code {rc}" + (f": {tail}" if tail else "")
                    if any(m in tail.lower() for m in _OOM_MARKERS):
                        raise OutOfMemory(msg)
                    try:  # the steps it trained before it failed are data: read them, then fail
                        trained = self._read(
                            log_path, fmt, info, cfg.command_log_keys, spec, start, partial=True
                        )
                    except Exception:  # noqa: BLE001 - a log cut mid-write: the steps streamed stand
                        trained = []
                    for step in trained:
                        if step.step > yielded:
                            yielded = step.step
                            yield step
                    raise RunFailed("failed", msg, started=bool(trained) or yielded > 0)
                steps = self._read(log_path, fmt, info, cfg.command_log_keys, spec, start, partial=False)
                if not steps:
                    raise RunFailed(
                        "failed", f"the command finished but its log {log_path} holds no steps", started=False
                    )
                self._record_checkpoints(spec, values, start, max(s.samples for s in steps))
                clean_exit = True
                for step in steps:
                    if step.step > yielded:
                        yielded = step.step
                        yield step
                return
        finally:
            _stop(proc)
            if not clean_exit and yielded_samples > start.samples:
                # stopped early (the caller closed us at its budget or target): record the checkpoints
                # of the steps already streamed, whose saves the trainer finished before logging on
                self._record_checkpoints(spec, values, start, yielded_samples, strict=False)

    @staticmethod
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

    @staticmethod
    def _read(
        path: Path,
        fmt: str,
        info: RunInfo,
        keys: dict[str, str],
        spec: RunSpec,
        start: Origin,
        partial: bool,
    ) -> list[StepRecord]:
        """The run's steps so far; while running, a missing or half-written log reads as no steps."""
        if partial and not path.exists():
            return []
        try:
            runs = read_log(path, fmt, info, keys or None, partial=partial)
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
        if spec.resume_from is None:
            return steps
        # a resumed run: its steps on the cumulative samples axis, counted from the checkpoint
        first = start.base_step(spec.recipe.backend.resume_steps)
        n = spec.candidate.batch_responses
        out = []
        for s in steps:
            k = s.step - first  # optimiser steps since the checkpoint
            if k <= 0:
                continue  # a trainer that logs its state at the resume point: the trunk's record
            out.append(dataclasses.replace(s, step=start.step + k, samples=start.samples + k * n))
        if out and (len(out) > 1 or not partial):
            _check_resumed_lr([s.lr for s in out], spec.candidate.lr, start)
        return out
