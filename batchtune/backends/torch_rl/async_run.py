"""A real asynchronous run: a rollout worker process and the trainer, overlapping (issue 30).

The worker (torch.multiprocessing, spawn) holds its own copy of the policy: it draws prompts, samples
G responses each, records the behaviour log-probs and scores them, and puts each finished batch on a
bounded queue (``algorithm.in_flight_cap`` batches; 0 = max(staleness, 1)). The trainer (this process)
takes batches in order and updates as the sync trainer does, importance-corrected against the
behaviour log-probs (grpo.py). Every ``algorithm.sync_every`` trainer steps it sends its weights
(a serialised state_dict in a file, its path through a pipe). Staleness bound: batch j (trained at
step j + 1, after j updates) is generated only with weights of version >= j - k (k =
candidate.staleness), so the worker waits for a sync when it runs that far ahead; hence
sync_every <= k + 1 (a k = 0 run, the probe's reference, syncs every step: ``sync_interval``).

Each StepRecord's metrics carry what the pipeline model needs, each side's busy and waiting time:
- trainer: ``wall_s`` (step wall time, end to end), ``queue_wait_s`` (blocked on the queue),
  ``unpack_s`` (deserialising the batch), train_s (the update) and ``train_cpu_s`` (its thread's CPU
  time), ``sync_s`` (serialise + send), ``outside_s`` (the consumer's time with the previous record);
- worker, for this batch: gen_s (generation + behaviour log-probs + reward) and ``gen_cpu_s`` (its
  CPU time), ``load_s`` (loading weights), ``bound_wait_s`` (waiting for weights new enough for the
  staleness bound); for the batch before: ``pack_s`` (serialising it) and ``put_wait_s`` (blocked on
  a full queue); ``worker_wait_s`` = bound_wait_s + put_wait_s;
- ``staleness`` (the lag actually reached).
A stage's wall time over its CPU time is how much the machine slowed it (1 on an idle core).

The run is not bit-reproducible: which weights a batch is sampled with depends on timing (at most k
steps old). Cleanup: the worker ignores SIGINT and watches its parent; the trainer stops and joins it
(terminate, then kill) on any exit of the generator: end, error, KeyboardInterrupt, close().
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from batchtune.analysis.sample.lr import warmup_factor
from batchtune.backends.models import load_model, resolve_device, resolve_dtype
from batchtune.backends.spec import RunFailed, RunSpec
from batchtune.backends.torch_rl.ppo import PPOLearner
from batchtune.backends.torch_rl.rollout import Rollout, generate, micro_batched, token_logprobs
from batchtune.backends.torch_rl.tasks import make_task
from batchtune.backends.torch_rl.trainer import (
    PromptSampler,
    epochs_of,
    evaluate,
    make_learner,
    setup_run,
)
from batchtune.records.types import StepRecord

POLL_S = 0.2  # how often a blocked side looks at the other's health and the stop flag
JOIN_S = 5.0


def to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(data: bytes) -> Any:
    """Tensors and plain containers only (a Rollout travels as its fields): nothing is unpickled
    that could run code, as everywhere else in the package."""
    buf = io.BytesIO(data)
    return torch.load(buf, map_location="cpu", weights_only=True)


def in_flight_cap(spec: RunSpec) -> int:
    return spec.recipe.algorithm.in_flight_cap or max(spec.candidate.staleness, 1)


def sync_interval(spec: RunSpec) -> int:
    """Trainer steps between weight syncs: ``algorithm.sync_every``, but every step for an on-policy
    (k = 0) run, the probe's reference, which the joint ranking models as synchronous (any longer
    interval would leave its rollouts stale)."""
    return 1 if spec.candidate.staleness == 0 else spec.recipe.algorithm.sync_every


def check_async(spec: RunSpec) -> None:
    alg, k = spec.recipe.algorithm, spec.candidate.staleness
    if spec.resume_from is not None or spec.save_at_samples:
        raise RunFailed("failed", "algorithm.mode = async cannot checkpoint; use a grid probe", started=False)
    if sync_interval(spec) > k + 1:
        why = f"algorithm.sync_every = {alg.sync_every} exceeds staleness + 1 = {k + 1} (rollouts would wait)"
        raise RunFailed("failed", why, started=False)


@dataclass(frozen=True)
class _Channels:
    """What the worker is handed: one-way pipes that carry only (tag or version, file path) and
    errors (never large, so a send never blocks), the in-flight slots, the stop flag, the folder."""

    batches: Any  # Connection, worker -> trainer
    weights: Any  # Connection, trainer -> worker
    slots: Any  # Semaphore(in-flight cap): taken by the worker per batch, given back by the trainer
    stop: Any  # Event
    dir: str


def _write(path: Path, data: bytes) -> str:
    """Write whole, then rename: a reader never sees part of a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return str(path)


def _take(path: str) -> bytes:
    data = Path(path).read_bytes()
    Path(path).unlink()
    return data


class _Worker:
    """The rollout side, run in the spawned process by ``worker_main``."""

    def __init__(self, spec: RunSpec, chan: _Channels, parent: int):
        recipe = spec.recipe
        self.spec, self.chan, self.weights, self.parent = spec, chan, chan.weights, parent
        self.task = make_task(recipe.task)
        device = resolve_device(recipe.hardware.device)
        self.dtype = resolve_dtype(recipe.model.dtype, device)
        self.lm = load_model(dataclasses.replace(recipe.model, dtype="float32"), str(device), spec.seed)
        self.lm.model.eval()
        self.version = -1  # the trainer's initial weights (version 0) come first on the weights pipe
        self.load_s = 0.0

    def alive(self) -> bool:
        return not self.chan.stop.is_set() and os.getppid() == self.parent

    def refresh(self, need: int) -> bool:
        """Load the newest weights sent; wait until their version is >= ``need``. False: stopped."""
        while True:
            latest = None
            while self.weights.poll():
                msg = self.weights.recv()
                if latest is not None:  # superseded before it was read
                    Path(latest[1]).unlink(missing_ok=True)
                latest = msg
            if latest is not None:
                self._load(latest)
            if self.version >= need:
                return True
            if self.weights.poll(POLL_S):
                self._load(self.weights.recv())
            elif not self.alive():
                return False

    def _load(self, msg: tuple[int, str]) -> None:
        t0 = time.perf_counter()
        self.lm.model.load_state_dict(from_bytes(_take(msg[1])))
        self.version = msg[0]
        self.load_s += time.perf_counter() - t0

    @torch.no_grad()
    def make(self, sampler: PromptSampler) -> dict[str, Any]:
        cand, gen_cfg, lm = self.spec.candidate, self.spec.recipe.generation, self.lm
        examples = [self.task.train[i] for i in sampler.take(cand.prompts)]
        group = [e for e in examples for _ in range(cand.group_size)]
        t0, c0 = time.perf_counter(), time.thread_time()
        rollout = generate(
            lm, [e.prompt for e in group], gen_cfg.max_new_tokens, self.dtype, True,
            gen_cfg.temperature, gen_cfg.top_p,
        )  # fmt: skip
        micro = self.spec.recipe.algorithm.micro_batch_responses
        temperature, device_type = gen_cfg.temperature, lm.device.type
        behaviour = micro_batched(
            lambda r: token_logprobs(lm.model, r, self.dtype, device_type, temperature), rollout, micro
        )
        scores = [self.task.reward(e, text) for e, text in zip(group, rollout.texts, strict=True)]
        bad = [s for s in scores if not math.isfinite(s)]
        if bad:
            raise RunFailed("failed", f"the reward function {self.task.reward_name} returned {bad[0]}")
        rollout = dataclasses.replace(rollout, sequences=rollout.sequences.cpu())
        fields = {f.name: getattr(rollout, f.name) for f in dataclasses.fields(rollout)}
        return {"rollout": fields, "behaviour": behaviour.cpu(), "rewards": scores,
                "gen_s": time.perf_counter() - t0, "gen_cpu_s": time.thread_time() - c0}  # fmt: skip

    def put(self, path: str) -> bool:
        """Hand the trainer a batch once a slot is free (fewer than the cap are waiting)."""
        while self.alive():
            if self.chan.slots.acquire(timeout=POLL_S):
                self.chan.batches.send(("batch", path))
                return True
        return False

    def run(self) -> None:
        spec = self.spec
        torch.manual_seed(spec.seed)
        sampler = PromptSampler(len(self.task.train), spec.seed)
        n_batches = math.ceil(spec.recipe.budget.max_samples / spec.candidate.batch_responses)
        pack = put_wait = 0.0  # the previous batch's serialising, and its wait on a full queue
        for j in range(n_batches):
            t0, self.load_s = time.perf_counter(), 0.0
            if not self.refresh(j - spec.candidate.staleness):
                return
            bound_wait = time.perf_counter() - t0 - self.load_s
            made = self.make(sampler)
            made.update(version=self.version, load_s=self.load_s, bound_wait_s=bound_wait,
                        put_wait_s=put_wait, pack_s=pack, wait_s=bound_wait + put_wait)  # fmt: skip
            t0 = time.perf_counter()
            path = _write(Path(self.chan.dir) / f"batch-{j}.pt", to_bytes(made))
            t1 = time.perf_counter()
            if not self.put(path):
                return
            pack, put_wait = t1 - t0, time.perf_counter() - t1


def worker_main(spec: RunSpec, chan: _Channels, parent: int, threads: int) -> None:
    """The rollout process: SIGINT is the parent's to handle; errors go back on the batches pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    try:
        worker = _Worker(spec, chan, parent)
        if worker.refresh(0):
            worker.run()
    except BaseException as exc:  # noqa: BLE001 - reported to the trainer, which raises it
        status = exc.status if isinstance(exc, RunFailed) else "failed"
        message = (
            exc.message if isinstance(exc, RunFailed) else f"rollout worker: {type(exc).__name__}: {exc}"
        )
        with contextlib.suppress(OSError):
            chan.batches.send(("error", status, message))
    finally:
        if os.getppid() != parent:  # the trainer died without its cleanup
            shutil.rmtree(chan.dir, ignore_errors=True)
    # all sent, files cleaned (stderr is line-buffered; nothing goes to stdout): skip the teardown
    os._exit(0)  # of torch and transformers, 1.5 s at load 2 and 3.5-5 s at load 5 that close waited


class _Pipe:
    """The worker process and its channels, from the trainer's side; ``close`` always cleans up.

    Batches and weights travel as files (written whole, then renamed; the reader deletes each),
    their paths through one-way pipes, and the in-flight cap is a semaphore. A multiprocessing
    queue sends from a feeder thread, which must win the GIL from its busy process, and carries
    weights larger than its pipe's buffer only while both processes are scheduled in turn: on a
    loaded machine each message then came late, by more than the pipeline model could see. A path
    is sent at once, in the sender's thread, and never blocks. The initial weights (version 0) go
    the same way, not in the process's arguments: spawn writes those into a pipe whose read end the
    parent holds until the write ends, so a child that died at start-up left them blocked forever;
    ``next_batch`` sees the death."""

    def __init__(self, spec: RunSpec, init: dict[str, torch.Tensor], threads: int):
        ctx = mp.get_context("spawn")
        self.batches, batches_w = ctx.Pipe(duplex=False)
        weights_r, self.weights = ctx.Pipe(duplex=False)
        self.slots, self.stop = ctx.Semaphore(in_flight_cap(spec)), ctx.Event()
        self.dir = Path(tempfile.mkdtemp(prefix="batchtune-async-"))
        chan = _Channels(batches_w, weights_r, self.slots, self.stop, str(self.dir))
        args = (spec, chan, os.getpid(), threads)
        self.proc = ctx.Process(target=worker_main, args=args, daemon=True, name="batchtune-rollout")
        self.received = 0
        self.send(0, init)
        try:
            self.proc.start()
        finally:
            batches_w.close()  # the worker's ends: its death is then an end of file here
            weights_r.close()

    def _exited(self) -> RunFailed:
        self.proc.join(JOIN_S)
        when = "at start-up" if self.received == 0 else f"after {self.received} batches"
        return RunFailed("failed", f"the rollout worker exited {when} (code {self.proc.exitcode})")

    def next_batch(self) -> dict[str, Any]:
        while not self.batches.poll(POLL_S):
            if not self.proc.is_alive() and not self.batches.poll():  # what it sent before it left
                raise self._exited()
        try:
            msg = self.batches.recv()
        except EOFError:
            raise self._exited() from None
        if msg[0] == "error":
            raise RunFailed(msg[1], msg[2])
        self.received += 1
        t0 = time.perf_counter()
        made = from_bytes(_take(msg[1]))
        self.slots.release()
        made["unpack_s"] = time.perf_counter() - t0
        return made

    def send(self, version: int, state: dict[str, torch.Tensor]) -> None:
        data = to_bytes({k: v.detach().cpu() for k, v in state.items()})
        self.weights.send((version, _write(self.dir / f"weights-{version}.pt", data)))

    def close(self) -> None:
        self.stop.set()
        self.proc.join(JOIN_S)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(JOIN_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.batches.close()
        self.weights.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def train_async(spec: RunSpec) -> Iterator[StepRecord]:
    """The trainer of an async run: one StepRecord per trainer step, as trainer.train yields."""
    check_async(spec)
    recipe = spec.recipe
    task, lm, compute_dtype = setup_run(spec)
    threads = recipe.hardware.threads or 1  # 1 per process: trainer and worker share the cores
    torch.set_num_threads(threads)
    learner, critic_lr = make_learner(spec, lm)
    epochs, sync_every = epochs_of(spec), sync_interval(spec)
    pipe = _Pipe(spec, lm.model.state_dict(), threads)
    try:
        yield from _steps(spec, pipe, task, lm, learner, critic_lr, compute_dtype, epochs, sync_every)
    finally:
        pipe.close()


def _steps(spec, pipe: _Pipe, task, lm, learner, critic_lr, compute_dtype, epochs, sync_every):
    recipe, cand = spec.recipe, spec.candidate
    max_samples, has_eval = recipe.budget.max_samples, len(task.eval) > 0
    step = samples = tokens = last_eval = 0

    def record(metrics, **kw) -> StepRecord:
        return spec.step_record(step, samples, tokens, kw.pop("lr", 0.0), metrics, **kw)

    if has_eval:
        t0 = time.perf_counter()
        yield record(
            {"eval_reward": evaluate(lm, task, spec, compute_dtype)}, other_s=time.perf_counter() - t0
        )
    last, outside = time.perf_counter(), 0.0
    while samples < max_samples:
        step += 1
        t0 = time.perf_counter()
        made = pipe.next_batch()
        queue_wait = time.perf_counter() - t0 - made["unpack_s"]
        rollout = Rollout(**made["rollout"])
        rewards = torch.tensor(made["rewards"], dtype=torch.float32, device=lm.device)
        behaviour = made["behaviour"].to(lm.device)
        rollout = dataclasses.replace(rollout, **{f: getattr(rollout, f).to(lm.device) for f in _TENSORS})
        samples += len(made["rewards"])
        tokens += int(rollout.response_lengths.sum())
        factor = warmup_factor(samples, recipe.optimizer.warmup_samples)
        lr = cand.lr * factor
        t0, c0 = time.perf_counter(), time.thread_time()
        if isinstance(learner, PPOLearner):
            stats = learner.update(rollout, rewards, cand.group_size, lr, critic_lr * factor, step,
                                   compute_dtype, behaviour, epochs)  # fmt: skip
        else:
            stats = learner.update(
                rollout, rewards, cand.group_size, lr, step, compute_dtype, behaviour, epochs
            )
        train_s, train_cpu = time.perf_counter() - t0 - stats.ref_s, time.thread_time() - c0
        sync_s = 0.0
        if step % sync_every == 0 and samples < max_samples:
            t0 = time.perf_counter()
            pipe.send(step, lm.model.state_dict())
            sync_s = time.perf_counter() - t0
        metrics = {
            "reward": float(rewards.mean()), "loss": stats.loss, "clip_frac": stats.clip_frac,
            "response_len": float(rollout.response_lengths.float().mean()),
            "staleness": float(step - 1 - made["version"]), "queue_wait_s": queue_wait, "sync_s": sync_s,
            "train_cpu_s": train_cpu, "outside_s": outside, **_worker_timers(made),
        }  # fmt: skip
        if stats.kl is not None:
            metrics["kl"] = stats.kl
        if stats.value_loss is not None:
            metrics["value_loss"] = stats.value_loss
        other_s = stats.ref_s
        every = recipe.task.eval_every_samples
        if has_eval and (every <= 0 or samples // every > last_eval // every or samples >= max_samples):
            t0 = time.perf_counter()
            metrics["eval_reward"] = evaluate(lm, task, spec, compute_dtype)
            other_s += time.perf_counter() - t0
            last_eval = samples
        now = time.perf_counter()
        metrics["wall_s"], last = now - last, now
        yield record(metrics, lr=lr, grad_norm=stats.grad_norm, critic_grad_norm=stats.critic_grad_norm,
                     gen_s=made["gen_s"], train_s=train_s, other_s=other_s)  # fmt: skip
        outside = time.perf_counter() - now  # the consumer's time with the record (in the next wall_s)


_TENSORS = ("sequences", "attention_mask", "position_ids", "response_mask")
_WORKER_TIMERS = ("gen_cpu_s", "load_s", "bound_wait_s", "put_wait_s", "pack_s", "unpack_s")


def _worker_timers(made: dict[str, Any]) -> dict[str, float]:
    """The worker's busy and waiting times that came with a batch (module docstring)."""
    return {"worker_wait_s": made["wait_s"], **{k: float(made[k]) for k in _WORKER_TIMERS}}
