"""Learning-rate scaling rules across batch sizes (docs/method.md §3.1). Pure Python, no torch.

When the batch grows by k = B / B_ref the learning rate must change, or invariance breaks:
- ``sqrt``   lr = base_lr * sqrt(k)   Adam family (Malladi et al. 2022, SDE argument; Hilton et al. 2021)
- ``linear`` lr = base_lr * k         SGD with warmup (Goyal et al. 2017)
- ``none``   lr = base_lr             a fixed-LR control
- ``table``  lr = table[B]            explicit per-batch values, e.g. from an earlier sweep

The full SDE rule for Adam also moves beta -> 1 - k (1 - beta) and eps -> eps / sqrt(k)
(:func:`adam_sde_hparams`). Warmup is counted in samples, so it means the same at every batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from batchtune.errors import RecipeError
from batchtune.recipe.schema import LR_RULES

RULES = LR_RULES


def scaled_lr(
    base_lr: float,
    batch: float,
    reference_batch: float,
    rule: str,
    table: Mapping[int, float] | None = None,
) -> float:
    """The learning rate for ``batch`` under ``rule``, given ``base_lr`` at ``reference_batch``.

    Batches are in the unit the caller scales by (total responses N = P*G for RL, tokens for
    pre-training). For ``table`` the batch must be a key of ``table``.
    """
    if base_lr <= 0 or not math.isfinite(base_lr):
        raise RecipeError(f"base learning rate must be a positive number, got {base_lr}")
    if batch <= 0 or reference_batch <= 0:
        raise RecipeError(f"batches must be positive, got batch={batch} reference={reference_batch}")
    k = batch / reference_batch
    if rule == "sqrt":
        return base_lr * math.sqrt(k)
    if rule == "linear":
        return base_lr * k
    if rule == "none":
        return base_lr
    if rule == "table":
        if not table:
            raise RecipeError("lr_scaling.rule = 'table' needs lr_scaling.table = {BATCH = LR, ...}")
        key = int(round(batch))
        if key not in table:
            known = ", ".join(str(b) for b in sorted(table))
            raise RecipeError(
                f"lr_scaling.table has no entry for batch {key} (it has {known}); "
                "add one or use rule = 'sqrt'"
            )
        return float(table[key])
    raise RecipeError(f"unknown LR scaling rule {rule!r}; choose one of {', '.join(RULES)}")


@dataclass(frozen=True)
class AdamHparams:
    """Adam's betas and eps moved by the SDE rule for a batch ratio k (Malladi et al. 2022)."""

    beta1: float
    beta2: float
    eps: float


def adam_sde_hparams(beta1: float, beta2: float, eps: float, k: float) -> AdamHparams:
    """beta -> 1 - k (1 - beta) (clamped to [0, 0.9999]), eps -> eps / sqrt(k)."""

    def move(beta: float) -> float:
        return min(max(1.0 - k * (1.0 - beta), 0.0), 0.9999)

    return AdamHparams(beta1=move(beta1), beta2=move(beta2), eps=eps / math.sqrt(k))


def warmup_factor(samples_seen: float, warmup_samples: float) -> float:
    """Linear warmup keyed by samples consumed, in (0, 1]; 1 when warmup_samples is 0."""
    if warmup_samples <= 0:
        return 1.0
    return min(1.0, max(samples_seen, 1.0) / warmup_samples)
