"""Pre-training reference fits and batch-size schedules (docs/method.md §6).

Published fits across compute budgets (Kaplan et al. 2020; DeepSeek LLM 2024) as priors, token-keyed
batch schedules that state the LR at every stage, and Merrill et al.'s batch warmup rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from batchtune.analysis.sample.lr import RULES, scaled_lr
from batchtune.errors import AnalysisError, RecipeError


def positive_finite(name: str, values: object) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(values, dtype=float)).reshape(-1)
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise AnalysisError(f"{name} must be finite and > 0, got {arr.tolist()}.")
    return arr


_positive_finite = positive_finite


def kaplan_critical_batch(loss: object, b_star: float = 2e8, alpha_b: float = 0.21) -> np.ndarray | float:
    """Kaplan et al. 2020 (arXiv 2001.08361, §5.1): ``B_crit(L) = B* / L^(1/alpha_B)`` tokens.

    ``B* ~ 2e8`` tokens and ``alpha_B ~ 0.21`` were fitted on their WebText2 models and tokeniser
    only; the loss is in nats per token. Use as a prior, not a measurement.
    """
    L = _positive_finite("loss", loss)
    out = b_star / L ** (1.0 / alpha_b)
    return out if np.ndim(np.asarray(loss, dtype=float)) else float(out[0])


def deepseek_bopt(compute_flops: object) -> np.ndarray | float:
    """DeepSeek LLM (arXiv 2401.02954, eq. 1): ``B_opt = 0.292 * C^0.3271`` tokens.

    ``C`` in FLOPs (their ``C = M * D`` with non-embedding FLOPs per token ``M``). Their data only.
    """
    c = _positive_finite("compute_flops", compute_flops)
    out = 0.292 * c**0.3271
    return out if np.ndim(np.asarray(compute_flops, dtype=float)) else float(out[0])


def deepseek_lr(compute_flops: object) -> np.ndarray | float:
    """DeepSeek LLM (arXiv 2401.02954, eq. 1): ``lr_opt = 0.3118 * C^-0.125``. Their data only."""
    c = _positive_finite("compute_flops", compute_flops)
    out = 0.3118 * c**-0.125
    return out if np.ndim(np.asarray(compute_flops, dtype=float)) else float(out[0])


@dataclass(frozen=True)
class ScheduleStage:
    """From ``start_tokens`` of data consumed on: batch ``batch_tokens`` at learning rate ``lr``.

    ``weight_decay`` is carried unchanged from the caller (None: not stated); Megatron-style
    token-keyed schedules do not rescale LR or weight decay for you (docs/method.md §6).
    """

    start_tokens: float
    batch_tokens: float
    lr: float
    weight_decay: float | None = None


def schedule_from_bopt(
    data_tokens_breakpoints: object,
    b_opt_values: object,
    base_lr: float,
    rule: str = "sqrt",
    *,
    batch_multiple_tokens: float | None = None,
    weight_decay: float | None = None,
    lr_table: dict[int, float] | None = None,
) -> tuple[ScheduleStage, ...]:
    """A token-keyed batch schedule: stage i starts at ``breakpoints[i]`` with ``b_opt_values[i]``.

    ``lr_i = base_lr * (B_i / B_0)^p`` with ``p = 0.5`` (``rule="sqrt"``, Adam, default),
    ``1`` (``"linear"``, SGD) or ``0`` (``"none"``), or ``lr_table[B_i]`` (``"table"``), through
    :func:`batchtune.analysis.sample.lr.scaled_lr`: ``base_lr`` is the LR tuned at the first stage's batch.
    ``batch_multiple_tokens`` rounds each batch to the nearest positive multiple (sequence length
    x data-parallel size); the LR follows the rounded batch. The first breakpoint must be 0.
    Example (Zhou et al. 2026 on Qwen3): breakpoints 0, 125e9, 250e9, 375e9 with 2M, 4M, 5M, 6M
    tokens per batch.
    """
    starts = np.atleast_1d(np.asarray(data_tokens_breakpoints, dtype=float))
    batches = _positive_finite("b_opt_values", b_opt_values)
    if starts.shape != batches.shape:
        raise AnalysisError(f"{starts.size} breakpoints but {batches.size} batch values.")
    if not np.all(np.isfinite(starts)) or starts[0] != 0 or np.any(np.diff(starts) <= 0):
        raise AnalysisError(
            f"breakpoints must start at 0 tokens and strictly increase, got {starts.tolist()}."
        )
    if rule not in RULES:
        raise AnalysisError(f"unknown LR rule {rule!r}; choose one of {', '.join(RULES)}.")
    if not (math.isfinite(base_lr) and base_lr > 0):
        raise AnalysisError(f"base_lr must be > 0, got {base_lr}.")
    if batch_multiple_tokens is not None:
        m = float(_positive_finite("batch_multiple_tokens", batch_multiple_tokens)[0])
        batches = np.maximum(np.round(batches / m), 1.0) * m
    try:  # the LR rules have one home, batchtune.analysis.sample.lr (docs/method.md §3.1)
        lrs = [scaled_lr(base_lr, float(b), float(batches[0]), rule, lr_table) for b in batches]
    except RecipeError as exc:
        raise AnalysisError(str(exc)) from exc
    return tuple(
        ScheduleStage(float(t), float(b), float(lr), weight_decay)
        for t, b, lr in zip(starts, batches, lrs, strict=True)
    )


@dataclass(frozen=True)
class WarmupStep:
    """One check of Merrill et al.'s batch warmup: the batch and LR in force after it."""

    index: int
    local_critical_batch: float
    batch: float
    lr: float
    doubled: bool
    at_tokens: float | None = None


def merrill_batch_warmup(
    local_critical_batches: object,
    current_batch: float,
    lr: float,
    *,
    at_tokens: object | None = None,
) -> tuple[WarmupStep, ...]:
    """Merrill et al. 2025 (arXiv 2505.23971) batch warmup, applied to measurements in order.

    Rule: whenever the measured local critical batch exceeds twice the current batch, double the
    batch and multiply the LR by sqrt(2). We apply at most one doubling per measurement (the rule
    as stated; the next measurement can double again).
    """
    crit = _positive_finite("local_critical_batches", local_critical_batches)
    batch = float(_positive_finite("current_batch", current_batch)[0])
    lr = float(_positive_finite("lr", lr)[0])
    tokens: list[float | None] = [None] * crit.size
    if at_tokens is not None:
        t = np.atleast_1d(np.asarray(at_tokens, dtype=float))
        if t.shape != crit.shape:
            raise AnalysisError(f"{t.size} positions for {crit.size} critical-batch measurements.")
        tokens = [float(x) for x in t]
    out = []
    for i, b_crit in enumerate(crit):
        doubled = bool(b_crit > 2.0 * batch)
        if doubled:
            batch, lr = 2.0 * batch, lr * math.sqrt(2.0)
        out.append(WarmupStep(i, float(b_crit), batch, lr, doubled, tokens[i]))
    return tuple(out)
