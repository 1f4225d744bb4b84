"""The training loop of the torch RL backend: one RunSpec in, one StepRecord per optimiser step out.

Each step: draw P prompts (a seeded torch.Generator walking shuffled epochs of the train set), sample
G responses each, score them, update (GRPO or PPO), evaluate on the held-out set when due, and yield
the step's record. Step 0 is an evaluation before any update (samples = 0, lr = 0), so every
candidate's curve starts from the same point. Determinism: the run's seed sets torch's global RNG
(generation sampling) and the prompt generator; the warm start never touches either.

Besides gen_s, train_s and other_s, each step's metrics carry its stage times under the names the
async run (async_run.py) gives them: ``gen_cpu_s`` (the calling thread's CPU time over gen_s:
generation and behaviour log-probs), ``train_cpu_s`` (over the update, reference log-probs
included), ``wall_s`` (end to end, since the previous record) and ``outside_s`` (the caller's time
with the previous record, inside this wall_s). A stage's wall over its CPU time is how much the
machine slowed it (1 on an idle core; torch's own threads are not counted: exact at
hardware.threads = 1). Records written before these times existed lack them.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from batchtune.analysis.sample.lr import warmup_factor
from batchtune.backends.models import LoadedModel, load_model, resolve_device, resolve_dtype
from batchtune.backends.spec import OutOfMemory, RunFailed, RunSpec, checkpoint_path
from batchtune.backends.torch_rl import checkpoint
from batchtune.backends.torch_rl.grpo import GRPOLearner, UpdateStats
from batchtune.backends.torch_rl.ppo import PPOLearner
from batchtune.backends.torch_rl.rollout import Rollout, chunks, generate
from batchtune.backends.torch_rl.tasks import Example, Task, make_task
from batchtune.backends.torch_rl.warmstart import warm_start_state
from batchtune.records.types import StepRecord

STAGE_TIMERS = ("gen_cpu_s", "train_cpu_s", "wall_s", "outside_s")  # per-step metrics (module docstring)


class PromptSampler:
    """Prompts without replacement within an epoch; a fresh seeded permutation for each epoch."""

    def __init__(self, n: int, seed: int):
        self.n = n
        self.gen = torch.Generator().manual_seed(seed)
        self.order: list[int] = []

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            if not self.order:
                self.order = torch.randperm(self.n, generator=self.gen).tolist()
            out.append(self.order.pop())
        return out


@dataclass
class Batch:
    """One scored rollout batch, waiting to be trained on (off-policy: up to k of them queue)."""

    group: list[Example]
    rollout: Rollout
    rewards: torch.Tensor
    behaviour: torch.Tensor | None  # log-probs of the policy that generated it (staleness > 0)
    version: int  # trainer steps done when it was generated (the behaviour policy's age)
    gen_s: float
    other_s: float
    gen_cpu_s: float = 0.0  # the thread's CPU time over gen_s


def make_batch(
    lm: LoadedModel, learner, task: Task, spec: RunSpec, sampler: PromptSampler, compute_dtype, version: int
) -> Batch:
    """Draw P prompts, sample G responses each with the current weights, score them; record the
    behaviour log-probs when the batch will be trained on by a later policy (candidate.staleness)."""
    cand, gen_cfg = spec.candidate, spec.recipe.generation
    examples = [task.train[i] for i in sampler.take(cand.prompts)]
    group = [e for e in examples for _ in range(cand.group_size)]
    t0, c0 = time.perf_counter(), time.thread_time()
    rollout = generate(
        lm, [e.prompt for e in group], gen_cfg.max_new_tokens, compute_dtype, True,
        gen_cfg.temperature, gen_cfg.top_p,
    )  # fmt: skip
    behaviour = None
    if cand.staleness > 0:
        behaviour = learner.frozen_logprobs(lm.model, rollout, compute_dtype)
    _sync(lm)
    gen_s, gen_cpu = time.perf_counter() - t0, time.thread_time() - c0

    t0 = time.perf_counter()
    scores = [task.reward(e, text) for e, text in zip(group, rollout.texts, strict=True)]
    bad = [s for s in scores if not math.isfinite(s)]
    if bad:
        raise RunFailed("failed", f"the reward function {task.reward_name} returned {bad[0]}")
    rewards = torch.tensor(scores, dtype=torch.float32, device=lm.device)
    return Batch(group, rollout, rewards, behaviour, version, gen_s, time.perf_counter() - t0, gen_cpu)


def epochs_of(spec: RunSpec) -> int:
    """Passes over the mini-batches: updates_per_batch / algorithm.mini_batches (0 = one pass)."""
    m = spec.recipe.algorithm.mini_batches
    u = spec.candidate.updates_per_batch or m
    if u % m:
        why = f"updates_per_batch = {u} is not a multiple of algorithm.mini_batches = {m}"
        raise RunFailed("failed", why, started=False)
    return u // m


def _sync(lm: LoadedModel) -> None:
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)


def cache_dir(spec: RunSpec):
    """<results>/cache: run_dir is <results>/runs/<run_id>."""
    return spec.run_dir.parent.parent / "cache"


def evaluate(lm: LoadedModel, task: Task, spec: RunSpec, compute_dtype: torch.dtype) -> float:
    """Mean reward of greedy responses on the held-out set."""
    rewards: list[float] = []
    micro = spec.recipe.algorithm.micro_batch_responses
    max_new = spec.recipe.generation.max_new_tokens
    for idx in chunks(len(task.eval), micro):
        batch: list[Example] = [task.eval[i] for i in idx.tolist()]
        out = generate(lm, [e.prompt for e in batch], max_new, compute_dtype, sample=False)
        rewards.extend(task.reward(e, text) for e, text in zip(batch, out.texts, strict=True))
    value = sum(rewards) / len(rewards)
    if not math.isfinite(value):
        raise RunFailed("failed", f"the reward function {task.reward_name} returned a non-finite value")
    return value


def setup_run(spec: RunSpec) -> tuple[Task, LoadedModel, torch.dtype]:
    """Threads, task, device, float32 model with the shared warm start (also the TRL backend's)."""
    recipe = spec.recipe
    if recipe.hardware.threads > 0:
        torch.set_num_threads(recipe.hardware.threads)
    task = make_task(recipe.task)
    device = resolve_device(recipe.hardware.device)
    compute_dtype = resolve_dtype(recipe.model.dtype, device)
    # float32 master weights; bf16/fp16 only inside autocast (pure-bf16 Adam loses small updates)
    lm = load_model(dataclasses.replace(recipe.model, dtype="float32"), str(device), spec.seed)
    state = warm_start_state(recipe, task, cache_dir(spec), lm.is_tiny)
    if state is not None:
        lm.model.load_state_dict(state)
    return task, lm, compute_dtype


def make_learner(spec: RunSpec, lm: LoadedModel) -> tuple[PPOLearner | GRPOLearner, float]:
    """The run's GRPO or PPO learner (with the frozen reference when kl_coef > 0), and the critic LR."""
    recipe, cand = spec.recipe, spec.candidate
    ref = None
    if recipe.algorithm.kl_coef > 0:
        ref = copy.deepcopy(lm.model).eval().requires_grad_(False)
    # dropout off in every pass: the policy that samples must be the one whose log-probs train
    lm.model.eval()
    batch = cand.batch_responses
    ref_batch = spec.reference_batch or batch
    critic_lr = cand.critic_lr if cand.critic_lr is not None else cand.lr
    if recipe.algorithm.name == "ppo":
        return PPOLearner(lm, ref, recipe, batch, ref_batch, cand.lr, critic_lr), critic_lr
    return GRPOLearner(lm, ref, recipe, batch, ref_batch, cand.lr), critic_lr


def train(spec: RunSpec) -> Iterator[StepRecord]:
    """The synchronous trainer (``algorithm.mode = "async"`` runs async_run.train_async instead)."""
    try:
        yield from _train(spec)
    except torch.cuda.OutOfMemoryError as exc:
        c = spec.candidate
        raise OutOfMemory(
            f"out of GPU memory at {c.batch_responses} responses per step ({c.prompts}x{c.group_size}): "
            f"{str(exc).splitlines()[0]}; set algorithm.micro_batch_responses to trade memory for time"
        ) from None
    finally:
        if torch.cuda.is_initialized():  # never create a CUDA context in a CPU run
            torch.cuda.empty_cache()


@dataclass
class _Run:
    """A sync run's parts and counters, carried across its steps."""

    spec: RunSpec
    task: Task
    lm: LoadedModel
    compute_dtype: torch.dtype
    sampler: PromptSampler
    learner: PPOLearner | GRPOLearner
    critic_lr: float
    epochs: int  # passes over the mini-batches per rollout batch (epochs_of)
    counters: checkpoint.Counters
    saves: list[int]  # sample counts still to checkpoint at

    @property
    def has_eval(self) -> bool:  # task.eval_size = 0: no held-out set, target the training reward
        return len(self.task.eval) > 0

    def record(self, lr: float, metrics: dict[str, float], **timing) -> StepRecord:
        """The record of the step the counters are at."""
        c = self.counters
        return self.spec.step_record(c.step, c.samples, c.tokens, lr, metrics, **timing)


def _start(spec: RunSpec) -> _Run:
    """Set the run up: model, seeds, prompt sampler, learner, and (a branch) the trunk's state."""
    task, lm, compute_dtype = setup_run(spec)
    torch.manual_seed(spec.seed)
    sampler = PromptSampler(len(task.train), spec.seed)
    learner, critic_lr = make_learner(spec, lm)
    epochs = epochs_of(spec)
    counters = checkpoint.Counters()
    if spec.resume_from is not None:  # a branch: the trunk's weights, optimiser and data position
        counters = checkpoint.load(spec.resume_from, learner, sampler, spec.seed)
    saves = sorted(x for x in spec.save_at_samples if x > counters.samples)
    return _Run(spec, task, lm, compute_dtype, sampler, learner, critic_lr, epochs, counters, saves)


def _train(spec: RunSpec) -> Iterator[StepRecord]:
    run = _start(spec)
    if run.has_eval and run.counters.samples == 0:
        t0 = time.perf_counter()
        eval_reward = evaluate(run.lm, run.task, spec, run.compute_dtype)
        yield run.record(0.0, {"eval_reward": eval_reward}, other_s=time.perf_counter() - t0)
    max_samples = spec.recipe.budget.max_samples
    pending: deque[Batch] = deque()  # off-policy: generated up to k trainer steps ahead
    generated = run.counters.samples
    last, outside = time.perf_counter(), 0.0
    while run.counters.samples < max_samples:
        run.counters.step += 1
        gen_s = other_s = gen_cpu = 0.0
        while len(pending) <= spec.candidate.staleness and generated < max_samples:
            made = make_batch(
                run.lm, run.learner, run.task, spec, run.sampler, run.compute_dtype, run.counters.step - 1
            )
            pending.append(made)
            generated += len(made.group)
            gen_s, other_s, gen_cpu = gen_s + made.gen_s, other_s + made.other_s, gen_cpu + made.gen_cpu_s
        ready = pending.popleft()
        lr, stats, train_s, train_cpu = _update(run, ready)
        metrics = _metrics(run, ready, stats)
        metrics |= {"gen_cpu_s": gen_cpu, "train_cpu_s": train_cpu, "outside_s": outside}
        other_s += stats.ref_s
        other_s += _evaluate_if_due(run, metrics)
        _save_due(run)  # before the yield: the caller may stop here
        now = time.perf_counter()
        metrics["wall_s"], last = now - last, now
        yield run.record(
            lr, metrics, grad_norm=stats.grad_norm, critic_grad_norm=stats.critic_grad_norm,
            gen_s=gen_s, train_s=train_s, other_s=other_s,
        )  # fmt: skip
        outside = time.perf_counter() - now  # the caller's time with the record (in the next wall_s)


def _update(run: _Run, ready: Batch) -> tuple[float, UpdateStats, float, float]:
    """Count the batch in and train on it: the actor LR (after warmup), the update's stats, its
    seconds (the reference log-probs' ``ref_s`` left out) and its thread's CPU seconds (not)."""
    c, cand, recipe = run.counters, run.spec.candidate, run.spec.recipe
    c.samples += len(ready.group)
    c.tokens += int(ready.rollout.response_lengths.sum())
    factor = warmup_factor(c.samples, recipe.optimizer.warmup_samples)
    lr = cand.lr * factor
    epochs = run.epochs
    t0, c0 = time.perf_counter(), time.thread_time()
    if isinstance(run.learner, PPOLearner):
        stats: UpdateStats = run.learner.update(
            ready.rollout, ready.rewards, cand.group_size, lr, run.critic_lr * factor, c.step,
            run.compute_dtype, ready.behaviour, epochs,
        )  # fmt: skip
    else:
        stats = run.learner.update(
            ready.rollout, ready.rewards, cand.group_size, lr, c.step, run.compute_dtype, ready.behaviour,
            epochs,
        )  # fmt: skip
    _sync(run.lm)
    return lr, stats, time.perf_counter() - t0 - stats.ref_s, time.thread_time() - c0


def _metrics(run: _Run, ready: Batch, stats: UpdateStats) -> dict[str, float]:
    """The step's training metrics: reward, loss, lengths, and what the algorithm and knobs add."""
    metrics = {
        "reward": float(ready.rewards.mean()),
        "loss": stats.loss,
        "response_len": float(ready.rollout.response_lengths.float().mean()),
        "clip_frac": stats.clip_frac,
    }
    if run.spec.candidate.staleness > 0:  # the policy lag this batch was trained at (< k while filling)
        metrics["staleness"] = float(run.counters.step - 1 - ready.version)
    if stats.kl is not None:
        metrics["kl"] = stats.kl
    if stats.value_loss is not None:
        metrics["value_loss"] = stats.value_loss
        factor = warmup_factor(run.counters.samples, run.spec.recipe.optimizer.warmup_samples)
        metrics["critic_lr"] = run.critic_lr * factor
    return metrics


def _evaluate_if_due(run: _Run, metrics: dict[str, float]) -> float:
    """Add ``eval_reward`` when an evaluation is due; its seconds (0 when none)."""
    c, max_samples = run.counters, run.spec.recipe.budget.max_samples
    every = run.spec.recipe.task.eval_every_samples
    # on the grid of multiples of `every` (and at the end), so a run resumed from a checkpoint
    # evaluates where the uninterrupted run does
    due = every <= 0 or c.samples // every > c.last_eval // every
    if not (run.has_eval and (due or c.samples >= max_samples)):
        return 0.0
    t0 = time.perf_counter()
    metrics["eval_reward"] = evaluate(run.lm, run.task, run.spec, run.compute_dtype)
    c.last_eval = c.samples
    return time.perf_counter() - t0


def _save_due(run: _Run) -> None:
    """Checkpoint at each sample count in ``spec.save_at_samples`` the run has reached."""
    c = run.counters
    while run.saves and c.samples >= run.saves[0]:
        assert run.spec.checkpoint_dir is not None, "save_at_samples needs a checkpoint_dir"
        path = checkpoint_path(run.spec.checkpoint_dir, run.saves.pop(0))
        state = checkpoint.Counters(c.step, c.samples, c.tokens, c.last_eval)
        checkpoint.save(path, run.learner, run.sampler, state, run.spec.seed)
