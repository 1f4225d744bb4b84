"""Optimisers, learning-rate setting and gradient clipping shared by the GRPO and PPO learners."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from batchtune.analysis.sample.lr import adam_sde_hparams
from batchtune.backends.spec import RunFailed
from batchtune.recipe.schema import LRScalingConfig, OptimizerConfig


def build_optimizer(
    params: Iterable[torch.nn.Parameter],
    cfg: OptimizerConfig,
    scaling: LRScalingConfig,
    batch: int,
    reference_batch: int,
    lr: float,
) -> torch.optim.Optimizer:
    """AdamW / Adam / plain SGD (no momentum) from ``optimizer.*``.

    With ``lr_scaling.adam_sde`` the betas and eps follow the SDE rule for k = batch / reference
    (Malladi et al. 2022): beta -> 1 - k (1 - beta), eps -> eps / sqrt(k).
    """
    params = list(params)
    beta1, beta2, eps = cfg.beta1, cfg.beta2, cfg.eps
    if scaling.adam_sde and cfg.name in ("adam", "adamw"):
        k = batch / reference_batch if reference_batch > 0 else 1.0
        h = adam_sde_hparams(beta1, beta2, eps, k)
        beta1, beta2, eps = h.beta1, h.beta2, h.eps
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=cfg.weight_decay)
    if cfg.name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=cfg.weight_decay)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=cfg.weight_decay)
    raise AssertionError(cfg.name)  # the recipe loader checks the choices


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_and_norm(params: list[torch.nn.Parameter], max_norm: float, what: str, step: int) -> float:
    """Clip the global gradient norm at ``max_norm`` (0 = no clipping) and return the PRE-clip norm.

    A non-finite norm means the run diverged: raise before the optimiser applies it.
    """
    limit = max_norm if max_norm > 0 else math.inf
    norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
    if not math.isfinite(norm):
        raise RunFailed("diverged", f"{what} gradient norm is {norm} at step {step}; lower the LR")
    return norm


def check_finite(value: float, what: str, step: int) -> None:
    if not math.isfinite(value):
        raise RunFailed("diverged", f"{what} is {value} at step {step}; lower the LR")
