"""Verifiable tasks for the torch RL backend: prompts, reference answers and rewards.

Built-in tasks (``task.name``), each with a deterministic train set and a disjoint held-out set:

- ``arithmetic``: ``"07+42="`` -> ``"49"``; operands are ``difficulty``-digit numbers, zero-padded
  so every prompt has the same length.
- ``copy``: ``"dbca="`` -> ``"dbca"``; ``sort``: -> ``"abcd"``; ``reverse``: -> ``"acbd"``; strings of
  ``difficulty`` letters drawn from the first :data:`LETTERS` letters of the alphabet.

Reward of the built-in tasks (:func:`char_reward`): per-character accuracy,
``r = #{i : response[i] == answer[i]} / max(len(response), len(answer))`` on the response with
surrounding whitespace stripped. An exact match scores 1, a wrong length is penalised, and a
response that gets some digits right scores in between: a dense signal that a tiny policy can climb
(exact match alone gives most groups zero variance, hence zero GRPO advantage, early on).

``jsonl``: prompts from ``task.prompts_file`` (one ``{"prompt": ..., "answer": ...}`` object per
line, ``answer`` optional) and the reward ``task.reward = "module:function"``, called as
``f(prompt, response, answer) -> float`` (``answer`` is None when the line has none).
"""

from __future__ import annotations

import functools
import importlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from batchtune.errors import BackendError
from batchtune.recipe.schema import TaskConfig

BUILTIN_TASKS = ("arithmetic", "copy", "sort", "reverse")
LETTERS = "abcdefghij"  # a small alphabet keeps the tiny tasks learnable by a 2-layer model
SPLIT_SEED = 20240611  # fixed: the split is a property of the task, not of a run's seed

RewardFn = Callable[[str, str, "str | None"], float]


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str | None


@dataclass(frozen=True)
class Task:
    name: str
    train: list[Example]
    eval: list[Example]
    reward_fn: RewardFn
    reward_name: str

    def reward(self, example: Example, response: str) -> float:
        """The reward of one response, as a finite-or-not float (the caller checks finiteness)."""
        try:
            value = self.reward_fn(example.prompt, response, example.answer)
            return float(value)
        except Exception as exc:  # a user's reward function: report which one and why
            from batchtune.backends.spec import RunFailed

            raise RunFailed(
                "failed",
                f"reward function {self.reward_name} raised {type(exc).__name__}: {exc} "
                f"(prompt {example.prompt!r}, response {response!r})",
            ) from None


def char_reward(prompt: str, response: str, answer: str | None) -> float:
    """Per-character accuracy against the answer; 1.0 exactly when the response matches."""
    assert answer is not None
    got = response.strip()
    if got == answer:
        return 1.0
    longest = max(len(got), len(answer))
    return sum(a == b for a, b in zip(got, answer, strict=False)) / longest if longest else 0.0


def _answer(name: str, prompt_body: str) -> str:
    if name == "copy":
        return prompt_body
    if name == "sort":
        return "".join(sorted(prompt_body))
    if name == "reverse":
        return prompt_body[::-1]
    raise AssertionError(name)


def _all_arithmetic(digits: int) -> list[Example]:
    top = 10**digits
    return [Example(f"{a:0{digits}d}+{b:0{digits}d}=", str(a + b)) for a in range(top) for b in range(top)]


def _sample_strings(name: str, length: int, count: int, rng: random.Random) -> list[Example]:
    space = len(LETTERS) ** length
    if count > space // 2:
        raise BackendError(
            f"task {name!r} with difficulty {length} has only {space} distinct strings; lower "
            "task.train_size + task.eval_size or raise task.difficulty"
        )
    seen: set[str] = set()
    out: list[Example] = []
    choice = rng.choice
    while len(out) < count:
        s = "".join([choice(LETTERS) for _ in range(length)])
        if s not in seen:
            seen.add(s)
            out.append(Example(f"{s}=", _answer(name, s)))
    return out


def builtin_task(cfg: TaskConfig) -> Task:
    if cfg.difficulty < 1:
        raise BackendError(f"task.difficulty must be at least 1, got {cfg.difficulty}")
    examples = _builtin_examples(cfg.name, cfg.difficulty, cfg.train_size + cfg.eval_size)
    return Task(
        name=cfg.name,
        train=list(examples[cfg.eval_size :]),
        eval=list(examples[: cfg.eval_size]),
        reward_fn=char_reward,
        reward_name="batchtune char_reward",
    )


@functools.lru_cache(maxsize=8)
def _builtin_examples(name: str, difficulty: int, total: int) -> tuple[Example, ...]:
    """A built-in task's examples, drawn once per process: every run of a probe (every candidate,
    seed and branch) builds the same task, and drawing it is ~30 ms of Python each time."""
    rng = random.Random(f"{SPLIT_SEED}-{name}-{difficulty}")
    if name == "arithmetic":
        pool = _all_arithmetic(difficulty)
        if total > len(pool):
            raise BackendError(
                f"arithmetic with {difficulty} digit(s) has {len(pool)} distinct problems, fewer "
                f"than task.train_size + task.eval_size = {total}; raise task.difficulty or lower them"
            )
        rng.shuffle(pool)
        return tuple(pool[:total])
    return tuple(_sample_strings(name, difficulty, total, rng))


def import_reward(spec: str) -> RewardFn:
    """Import ``"module:function"``; a BackendError that says what to fix when it cannot."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise BackendError(
            f"task.reward = {spec!r}: expected 'module:function', e.g. 'my_rewards:exact_match'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendError(
            f"task.reward = {spec!r}: cannot import module {module_name!r} ({exc}); put it on "
            "PYTHONPATH or install it"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise BackendError(f"task.reward = {spec!r}: module {module_name!r} has no function {attr!r}")
    return fn


def jsonl_task(cfg: TaskConfig) -> Task:
    if not cfg.prompts_file:
        raise BackendError("task.name = 'jsonl' needs task.prompts_file (one JSON object per line)")
    if not cfg.reward:
        raise BackendError("task.name = 'jsonl' needs task.reward = 'module:function'")
    path = Path(cfg.prompts_file)
    if not path.is_file():
        raise BackendError(f"task.prompts_file {path} not found")
    examples: list[Example] = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt = row["prompt"]
        except (json.JSONDecodeError, KeyError, TypeError, RecursionError):
            raise BackendError(
                f'{path}:{i}: expected a JSON object with a "prompt" key (and optionally "answer")'
            ) from None
        answer = row.get("answer")  # optional by the file format, not a config default
        examples.append(Example(str(prompt), None if answer is None else str(answer)))
    if len(examples) <= cfg.eval_size:
        raise BackendError(
            f"{path} has {len(examples)} prompts, not more than task.eval_size = {cfg.eval_size}; "
            "add prompts or lower task.eval_size"
        )
    random.Random(SPLIT_SEED).shuffle(examples)
    return Task(
        name="jsonl",
        train=examples[cfg.eval_size :][: cfg.train_size],
        eval=examples[: cfg.eval_size],
        reward_fn=import_reward(cfg.reward),
        reward_name=cfg.reward,
    )


def make_task(cfg: TaskConfig) -> Task:
    if cfg.name in BUILTIN_TASKS:
        return builtin_task(cfg)
    if cfg.name == "jsonl":
        return jsonl_task(cfg)
    raise BackendError(f"unknown task {cfg.name!r}; choose one of {', '.join(BUILTIN_TASKS)} or 'jsonl'")
