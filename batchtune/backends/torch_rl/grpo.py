"""GRPO (Shao et al. 2024, DeepSeekMath): group-normalised advantages, PPO-clip, optional k3 KL.

For prompt q with G sampled responses o_1..o_G and rewards r_1..r_G:

    A_i = (r_i - mean(r)) / (std(r) + 1e-6)           (std unbiased, as in TRL and verl)
    rho_it = pi(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)
    L = sum_{i,t} m_it [ -min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps) A_i) + beta k3_it ] / sum m_it
    k3_it = exp(l_ref - l) - (l_ref - l) - 1         (Schulman's unbiased, positive KL estimator)

m masks pads and everything after the first EOS; the mean is token-level over the mini-batch (DAPO,
Yu et al. 2025), so long and short responses weigh per token. With one mini-batch per rollout batch
(the default, policy age independent of batch) pi_old is the current policy and rho = 1 with the
right gradient; with several, the batch is split by whole groups and pi_old is computed once before
the first optimiser step. Off-policy (``staleness`` k > 0): pi_old is the behaviour policy, whose
log-probs were recorded when the rollout was generated with weights k trainer steps old, so rho is
the clipped importance ratio pi_theta / pi_behaviour (as verl and TRL do). ``epochs`` passes over
the mini-batches give updates_per_batch = mini_batches x epochs optimiser steps per rollout batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from batchtune.backends.models import LoadedModel
from batchtune.backends.torch_rl.optim import build_optimizer, check_finite, clip_and_norm, set_lr
from batchtune.backends.torch_rl.rollout import Rollout, micro_batched, micro_batches, token_logprobs
from batchtune.recipe.schema import Recipe

ADV_EPS = 1e-6


@dataclass
class UpdateStats:
    loss: float
    grad_norm: float
    kl: float | None = None
    critic_grad_norm: float | None = None
    value_loss: float | None = None
    clip_frac: float = 0.0
    ref_s: float = 0.0  # seconds spent on reference log-probs (reported as other_s)


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(r - group mean) / (group std + eps) for rewards laid out group after group."""
    r = rewards.view(-1, group_size)
    adv = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + ADV_EPS)
    return adv.reshape(-1)


def clipped_pg(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, clip_eps: float):
    """Per-token PPO-clip objective (to minimise) and the clipped indicator."""
    ratio = torch.exp(logp - old)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    return -torch.minimum(unclipped, clipped), (clipped != unclipped).float()


def k3(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    d = ref - logp
    return torch.exp(d) - d - 1.0


def minibatch_groups(n_responses: int, group_size: int, mini_batches: int) -> list[torch.Tensor]:
    """Response indices of each mini-batch, split by whole groups (responses of one prompt correlate)."""
    groups = torch.arange(n_responses // group_size)
    parts = groups.chunk(min(mini_batches, len(groups)))
    return [(p[:, None] * group_size + torch.arange(group_size)).reshape(-1) for p in parts]


class GRPOLearner:
    def __init__(
        self, lm: LoadedModel, ref_model, recipe: Recipe, batch: int, reference_batch: int, lr: float
    ):
        self.lm = lm
        self.ref = ref_model
        self.recipe = recipe
        self.params = [p for p in lm.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(
            self.params, recipe.optimizer, recipe.lr_scaling, batch, reference_batch, lr
        )

    def logprobs(self, model, rollout: Rollout, compute_dtype: torch.dtype) -> torch.Tensor:
        return token_logprobs(
            model, rollout, compute_dtype, self.lm.device.type, self.recipe.generation.temperature
        )

    def frozen_logprobs(self, model, rollout: Rollout, compute_dtype: torch.dtype) -> torch.Tensor:
        """Log-probs without grad, micro-batched (the behaviour policy's, at generation)."""
        micro = self.recipe.algorithm.micro_batch_responses
        return micro_batched(lambda r: self.logprobs(model, r, compute_dtype), rollout, micro)

    def update(
        self,
        rollout: Rollout,
        rewards: torch.Tensor,
        group_size: int,
        lr: float,
        step: int,
        compute_dtype,
        behaviour: torch.Tensor | None = None,
        epochs: int = 1,
    ) -> UpdateStats:
        alg = self.recipe.algorithm
        adv = group_advantages(rewards, group_size)
        mask = rollout.response_mask
        t0 = time.perf_counter()
        ref = self.frozen_logprobs(self.ref, rollout, compute_dtype) if alg.kl_coef > 0 else None
        if ref is not None and ref.is_cuda:
            torch.cuda.synchronize(ref.device)
        ref_s = time.perf_counter() - t0
        mbs = minibatch_groups(len(rollout.texts), group_size, alg.mini_batches) * epochs
        old_all = behaviour
        if old_all is None and len(mbs) > 1:
            old_all = self.frozen_logprobs(self.lm.model, rollout, compute_dtype)
        set_lr(self.optimizer, lr)
        losses, norms, kls, clips = [], [], [], []
        for mb in mbs:
            n_tok = mask[mb].sum().clamp(min=1.0)
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum = kl_sum = clip_sum = 0.0
            for idx, sub, m in micro_batches(rollout, mb, alg.micro_batch_responses):
                logp = self.logprobs(self.lm.model, sub, compute_dtype)
                old = logp.detach() if old_all is None else old_all[idx]
                pg, clipped = clipped_pg(logp, old, adv[idx].unsqueeze(-1), alg.clip_eps)
                per_tok = pg
                if ref is not None:
                    kl_tok = k3(logp, ref[idx])
                    per_tok = pg + alg.kl_coef * kl_tok
                    kl_sum += float((kl_tok.detach() * m).sum())
                loss = (per_tok * m).sum() / n_tok
                loss.backward()
                loss_sum += float(loss.detach())
                clip_sum += float((clipped * m).sum())
            check_finite(loss_sum, "the policy loss", step)
            norms.append(clip_and_norm(self.params, self.recipe.optimizer.grad_clip, "the actor", step))
            self.optimizer.step()
            losses.append(loss_sum)
            kls.append(kl_sum / float(n_tok))
            clips.append(clip_sum / float(n_tok))
        return UpdateStats(
            loss=sum(losses) / len(losses),
            grad_norm=sum(norms) / len(norms),
            kl=sum(kls) / len(kls) if ref is not None else None,
            clip_frac=sum(clips) / len(clips),
            ref_s=ref_s,
        )
