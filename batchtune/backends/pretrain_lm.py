"""The built-in pre-training backend (backend.training = "pretrain"): a tiny Llama from scratch.

A decoder LM built from a transformers ``LlamaConfig`` in code (sizes below; nothing downloaded),
AdamW, a warmup-stable-decay schedule (Hägele et al. 2024, arXiv 2405.18392; cosine as an option),
the batch's LR by the recipe's rule (the candidate carries it, from ``analysis/sample/lr.py``), batches in
tokens (whole sequences), gradient accumulation when ``micro_batch_tokens`` is below the batch,
and one StepRecord per optimiser step with ``samples = tokens`` and an eval loss every
``eval_every_tokens``.

Checkpoints for branches (issue 10): :class:`LMRun` holds model, optimiser, the data stream's RNG
state and counters; ``run.save_checkpoint(path)`` and ``LMRun.resume_from(path, recipe)`` round-trip
them exactly. The backend honours the RunSpec branch contract: ``spec.resume_from`` (a checkpoint
file or a ``ckpt-<samples>`` folder holding ``state.pt``) and ``spec.save_at_samples`` into
``spec.checkpoint_dir`` (``supports_checkpoints = True``).
``run.step(batch_seqs, lr)`` takes the batch and LR per step, so a token-keyed batch schedule drives
the same object.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from batchtune.backends.checkpoint_file import read_state
from batchtune.backends.pretrain_data import eval_batch, make_data, stream
from batchtune.backends.spec import RunFailed, RunSpec, branch_seed, checkpoint_path
from batchtune.recipe.schema import Recipe
from batchtune.records.types import StepRecord

# (hidden, intermediate, layers, heads): we choose; xs trains ~1M tokens in about a minute on 2 cores
SIZES = {"xs": (64, 192, 2, 4), "s": (128, 384, 4, 4), "m": (256, 768, 6, 8)}


def build_model(size: str, vocab: int, seq_len: int, seed: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inter, layers, heads = SIZES[size]
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max(seq_len, 64),
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def lr_factor(
    tokens: float, schedule: str, warmup_tokens: float, total_tokens: float, decay_fraction: float
) -> float:
    """LR multiplier after ``tokens``: linear warmup, then constant (stable), then a linear decay to 0
    over the last ``decay_fraction`` of ``total_tokens`` (WSD); or cosine to 0 after warmup."""
    warm = min(1.0, max(tokens, 1.0) / warmup_tokens) if warmup_tokens > 0 else 1.0
    if schedule == "cosine":
        frac = min(max(tokens - warmup_tokens, 0.0) / max(total_tokens - warmup_tokens, 1.0), 1.0)
        return warm * 0.5 * (1.0 + math.cos(math.pi * frac))
    if schedule == "wsd" and decay_fraction > 0:
        start = (1.0 - decay_fraction) * total_tokens
        if tokens > start:
            return warm * max(0.0, (total_tokens - tokens) / (total_tokens - start))
    return warm


class LMRun:
    """One training run's state: model, AdamW, data stream, counters. Checkpointable."""

    def __init__(self, recipe: Recipe, seed: int, device: str = "cpu"):
        p, o = recipe.pretrain, recipe.optimizer
        if recipe.hardware.threads:
            torch.set_num_threads(recipe.hardware.threads)
        self.recipe, self.seed, self.device = recipe, seed, torch.device(device)
        self.source, self.vocab, self.loss_floor = make_data(p)
        self.model = build_model(p.size, self.vocab, p.seq_len, seed).to(self.device)
        # fused: one kernel for all parameters; 10-15% of a step of the xs model on CPU (measured)
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=o.lr,
            betas=(o.beta1, o.beta2),
            eps=o.eps,
            weight_decay=o.weight_decay,
            fused=self.device.type in ("cpu", "cuda"),
        )
        self.rng = stream(seed, p.data_seed)
        self.eval_ids = torch.as_tensor(eval_batch(self.source, p), device=self.device)
        self.steps = 0
        self.tokens = 0

    def _loss(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids).logits[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))

    def step(self, batch_seqs: int, lr: float) -> tuple[float, float]:
        """One optimiser step on ``batch_seqs`` sequences at ``lr``; returns (train loss, grad norm)."""
        p = self.recipe.pretrain
        ids = torch.as_tensor(self.source.sample(self.rng, batch_seqs, p.seq_len), device=self.device)
        micro = p.micro_batch_tokens // p.seq_len or batch_seqs
        self.model.train()
        for group in self.opt.param_groups:
            group["lr"] = lr
        total = 0.0
        for chunk in torch.split(ids, micro):
            loss = self._loss(chunk) * (chunk.size(0) / batch_seqs)
            loss.backward()
            total += float(loss.detach())
        clip = self.recipe.optimizer.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else math.inf)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.steps += 1
        self.tokens += batch_seqs * p.seq_len
        return total, float(norm)

    @torch.no_grad()
    def eval_loss(self) -> float:
        self.model.eval()
        return float(self._loss(self.eval_ids))

    def save_checkpoint(self, path: str | Path) -> Path:
        """Model, optimiser, data position (RNG state), counters and torch's RNG, in one file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "model": self.model.state_dict(),
            "opt": self.opt.state_dict(),
            "data_rng": self.rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(),
            "steps": self.steps,
            "tokens": self.tokens,
            "seed": self.seed,
        }
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(path)
        return path

    @classmethod
    def resume_from(
        cls, path: str | Path, recipe: Recipe, device: str = "cpu", seed: int | None = None
    ) -> LMRun:
        """The run saved at ``path``. ``seed`` (a branch's): None or the trunk's own continues the
        trunk's data stream exactly; another seed keeps weights and optimiser but draws its data
        from a fresh stream keyed by (seed, tokens), so the seeds of a checkpoint are replicates."""
        # tensors and plain containers only (weights_only): a planted pickle is refused, not run
        state = read_state(Path(path))
        saved_seed = int(state["seed"])
        run = cls(recipe, saved_seed, device)
        run.model.load_state_dict(state["model"])
        run.opt.load_state_dict(state["opt"])
        run.steps, run.tokens = int(state["steps"]), int(state["tokens"])
        if seed is None or seed == saved_seed:
            run.rng.bit_generator.state = state["data_rng"]
            torch.set_rng_state(state["torch_rng"])
        else:
            run.seed = seed
            run.rng = np.random.default_rng([recipe.pretrain.data_seed, seed, run.tokens, 37])
            torch.manual_seed(branch_seed(seed, run.tokens))
        return run


def _state_file(path: Path) -> Path:
    return path / "state.pt" if path.suffix != ".pt" else path


class PretrainLMBackend:
    name = "pretrain"
    supports_checkpoints = True

    def train(self, spec: RunSpec) -> Iterator[StepRecord]:
        """Steps of one run at the candidate's batch (``prompts`` sequences of ``group_size`` tokens)
        and LR, until ``pretrain.max_tokens``; the caller stops it early by closing the generator."""
        recipe, cand = spec.recipe, spec.candidate
        p = recipe.pretrain
        device = "cuda" if recipe.hardware.device == "cuda" else "cpu"
        if spec.resume_from is not None:
            run = LMRun.resume_from(_state_file(Path(spec.resume_from)), recipe, device, spec.seed)
        else:
            run = LMRun(recipe, spec.seed, device)
        saves = sorted(s for s in spec.save_at_samples if s > run.tokens)
        next_eval = (run.tokens // p.eval_every_tokens + 1) * p.eval_every_tokens
        metrics: dict[str, float] = {}
        if run.tokens == 0:
            metrics["eval_loss"] = run.eval_loss()
        if run.loss_floor is not None:
            metrics["loss_floor"] = run.loss_floor
        while run.tokens < p.max_tokens:
            lr = cand.lr * lr_factor(run.tokens, p.schedule, p.warmup_tokens, p.max_tokens, p.decay_fraction)
            t0 = time.perf_counter()
            loss, norm = run.step(cand.prompts, lr)
            train_s = time.perf_counter() - t0
            if not math.isfinite(loss):
                raise RunFailed("diverged", f"train loss not finite at step {run.steps}")
            metrics = {**metrics, "loss": loss}
            while saves and run.tokens >= saves[0] and spec.checkpoint_dir is not None:
                run.save_checkpoint(_state_file(checkpoint_path(Path(spec.checkpoint_dir), saves.pop(0))))
            other_s = 0.0
            if run.tokens >= next_eval or run.tokens >= p.max_tokens:
                t1 = time.perf_counter()
                metrics["eval_loss"] = run.eval_loss()
                other_s = time.perf_counter() - t1
                next_eval += p.eval_every_tokens * max(
                    1, math.ceil((run.tokens - next_eval + 1) / p.eval_every_tokens)
                )
            samples = tokens = run.tokens  # the samples of a pre-training run are its tokens
            yield spec.step_record(
                run.steps, samples, tokens, lr, metrics, grad_norm=norm, train_s=train_s, other_s=other_s
            )
            metrics = {k: v for k, v in metrics.items() if k == "loss_floor"}


def tokens_per_s(recipe: Recipe, batch_seqs: int, steps: int, warmup: int = 3) -> float:
    """Training tokens per second of :class:`LMRun` at ``batch_seqs`` (benchmarks/)."""
    run = LMRun(recipe, 0)
    for _ in range(warmup):
        run.step(batch_seqs, recipe.optimizer.lr)
    t0 = time.perf_counter()
    for _ in range(steps):
        run.step(batch_seqs, recipe.optimizer.lr)
    return steps * batch_seqs * recipe.pretrain.seq_len / (time.perf_counter() - t0)


__all__ = ["SIZES", "LMRun", "PretrainLMBackend", "build_model", "lr_factor", "np", "tokens_per_s"]
