"""Warm start of the tiny model: a short supervised pre-training on the task, computed once and cached.

RL from a random tiny model has no signal (every response scores ~0, so every GRPO group has zero
advantage). A few hundred supervised steps on (prompt, answer) pairs give a policy whose greedy
answers are partly right and whose samples vary, so RL starts with signal and room to improve.

The warm start is a function of (model config, task, warm-start settings) only, never of a run's
seed: it is trained from a fixed seed on CPU in float32 and saved under ``<results>/cache/``, so
every candidate and every seed starts from the same weights and candidates differ only by batch,
LR and seed. Parallel workers take an exclusive ``fcntl`` lock on the cache entry; the first one
computes it and writes it atomically, the others wait and load it. A pretrained model has no warm
start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from batchtune.backends.models import LoadedModel, load_model
from batchtune.backends.torch_rl.tasks import Task
from batchtune.recipe.schema import Recipe

WARMSTART_SEED = 1234  # fixed on purpose: the warm start must not depend on the run's seed
CACHE_VERSION = 1  # bump when the warm-start procedure changes, so stale caches are not reused


def warm_start_key(recipe: Recipe) -> str:
    task = recipe.task
    prompts = Path(task.prompts_file) if task.prompts_file else None
    content = hashlib.sha256(prompts.read_bytes()).hexdigest() if prompts and prompts.is_file() else ""
    payload = {
        "version": CACHE_VERSION,
        "seed": WARMSTART_SEED,
        "model": {k: v for k, v in dataclasses.asdict(recipe.model).items() if k != "dtype"},
        "task": [task.name, task.difficulty, task.train_size, task.eval_size, content],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _sft_batch(lm: LoadedModel, pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded prompt+answer+EOS ids and a loss mask on the answer and EOS tokens."""
    rows, starts = [], []
    for prompt, answer in pairs:
        p = lm.encode(prompt)
        a = lm.tokenizer.encode(answer, add_bos=False) if lm.is_tiny else lm.encode(answer)[1:]
        rows.append([*p, *a, lm.tokenizer.eos_token_id])
        starts.append(len(p))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), lm.tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width))
    for i, (r, s) in enumerate(zip(rows, starts, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, s : len(r)] = 1.0
    return ids, mask


def pretrain(recipe: Recipe, task: Task) -> dict[str, Any]:
    """Supervised warm start (teacher forcing on answer tokens), CPU float32, fixed seed."""
    cfg = recipe.model
    lm = load_model(dataclasses.replace(cfg, dtype="float32"), "cpu", WARMSTART_SEED)
    model = lm.model
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.pretrain_lr)
    gen = torch.Generator().manual_seed(WARMSTART_SEED)
    examples = [(e.prompt, e.answer) for e in task.train if e.answer is not None]
    for _ in range(cfg.pretrain_steps):
        idx = torch.randint(len(examples), (cfg.pretrain_batch,), generator=gen).tolist()
        ids, mask = _sft_batch(lm, [examples[i] for i in idx])
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        )
        loss = (nll * mask[:, 1:].reshape(-1)).sum() / mask[:, 1:].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def warm_start_state(recipe: Recipe, task: Task, cache_dir: Path, is_tiny: bool) -> dict[str, Any] | None:
    """The cached warm-start weights, computing them under a lock if absent; None when not used.

    Not used for pretrained models, when ``model.pretrain_steps`` is 0, or when the task has no
    reference answers (a JSONL file without ``answer`` fields).
    """
    if not is_tiny or recipe.model.pretrain_steps <= 0:
        return None
    if not any(e.answer is not None for e in task.train):
        return None
    path = cache_dir / f"warmstart-{recipe.task.name}-{warm_start_key(recipe)}.pt"
    with _exclusive(path.with_name(path.name + ".lock")):
        if path.exists():
            return torch.load(path, map_location="cpu", weights_only=True)
        # the warm start must not disturb the caller's RNG streams
        with torch.random.fork_rng(devices=[]):
            state = pretrain(recipe, task)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        return state
