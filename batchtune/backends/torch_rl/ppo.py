"""PPO for LMs (Ouyang et al. 2022; Hilton et al. 2021 for the batch-size view): actor and critic.

Critic: a copy of the (warm-started) model's transformer body with a zero-initialised linear value
head on its last hidden state. V_t is read at the position that predicts response token t, i.e. the
value of state (x, y_<t). Per-token rewards, with l = log pi_old and l_ref the frozen reference:

    r_t = -beta (l_t - l_ref_t)  + [t = last response token] * R(x, y)      (beta = kl_coef)

GAE (Schulman et al. 2016), over response tokens with V = 0 after the last one:

    delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lam A_{t+1},   returns_t = A_t + V_t

Advantages are whitened over the batch's valid tokens. Actor loss: token-level PPO-clip (as in
grpo.py). Critic loss: clipped value loss 0.5 max((V - ret)^2, (V_old + clip(V - V_old, +-c) - ret)^2),
c = value_clip. Off-policy (staleness k > 0) l is the behaviour policy's log-probs recorded at
generation; ``epochs`` passes over the mini-batches, as in grpo.py. Actor and critic have separate
optimisers and LRs (docs/method.md §3.5: their batch scales differ); both pre-clip gradient norms are logged.
"""

from __future__ import annotations

import copy
import time

import torch

from batchtune.backends.models import LoadedModel
from batchtune.backends.torch_rl.grpo import UpdateStats, clipped_pg, minibatch_groups
from batchtune.backends.torch_rl.optim import build_optimizer, check_finite, clip_and_norm, set_lr
from batchtune.backends.torch_rl.rollout import (
    Rollout,
    hidden_states,
    micro_batched,
    micro_batches,
    token_logprobs,
)
from batchtune.recipe.schema import Recipe


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns, [N, T]; masked tokens get 0 and do not propagate value."""
    values = values * mask
    adv = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[0], device=rewards.device)
    for t in reversed(range(rewards.shape[1])):
        next_v = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = (delta + gamma * lam * last) * mask[:, t]
        adv[:, t] = last
    return adv, adv + values


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    n = mask.sum().clamp(min=1.0)
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / n
    return (x - mean) * torch.rsqrt(var + eps) * mask


class Critic(torch.nn.Module):
    def __init__(self, actor: torch.nn.Module):
        super().__init__()
        self.body = copy.deepcopy(actor).base_model  # drop the LM head; keep the warm-started body
        hidden = actor.get_input_embeddings().embedding_dim  # type: ignore[operator]
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def values(self, rollout: Rollout, compute_dtype: torch.dtype, device_type: str) -> torch.Tensor:
        h = hidden_states(self.body, rollout, compute_dtype, device_type)
        return self.head(h).squeeze(-1)


class PPOLearner:
    def __init__(
        self,
        lm: LoadedModel,
        ref_model,
        recipe: Recipe,
        batch: int,
        reference_batch: int,
        lr: float,
        critic_lr: float,
    ):
        self.lm = lm
        self.ref = ref_model
        self.recipe = recipe
        self.critic = Critic(lm.model).to(lm.device)
        self.critic.eval()  # no dropout, as for the actor
        self.params = [p for p in lm.model.parameters() if p.requires_grad]
        self.critic_params = list(self.critic.parameters())
        opt, scaling = recipe.optimizer, recipe.lr_scaling
        self.optimizer = build_optimizer(self.params, opt, scaling, batch, reference_batch, lr)
        self.critic_optimizer = build_optimizer(
            self.critic_params, opt, scaling, batch, reference_batch, critic_lr
        )

    def _logprobs(self, model, rollout: Rollout, compute_dtype) -> torch.Tensor:
        return token_logprobs(
            model, rollout, compute_dtype, self.lm.device.type, self.recipe.generation.temperature
        )

    def _frozen(self, fn, rollout: Rollout) -> torch.Tensor:
        return micro_batched(fn, rollout, self.recipe.algorithm.micro_batch_responses)

    def frozen_logprobs(self, model, rollout: Rollout, compute_dtype) -> torch.Tensor:
        """Log-probs without grad, micro-batched (the behaviour policy's, at generation)."""
        return self._frozen(lambda r: self._logprobs(model, r, compute_dtype), rollout)

    def update(
        self,
        rollout: Rollout,
        rewards: torch.Tensor,
        group_size: int,
        lr: float,
        critic_lr: float,
        step: int,
        compute_dtype,
        behaviour: torch.Tensor | None = None,
        epochs: int = 1,
    ) -> UpdateStats:
        alg = self.recipe.algorithm
        dev = self.lm.device.type
        mask = rollout.response_mask
        old_logp = behaviour  # off-policy: the log-probs recorded at generation (grpo.py)
        if old_logp is None:
            old_logp = self._frozen(lambda r: self._logprobs(self.lm.model, r, compute_dtype), rollout)
        old_v = self._frozen(lambda r: self.critic.values(r, compute_dtype, dev), rollout)
        token_rewards = torch.zeros_like(mask)
        t0 = time.perf_counter()
        kl = None
        if alg.kl_coef > 0:
            ref = self._frozen(lambda r: self._logprobs(self.ref, r, compute_dtype), rollout)
            kl_tok = (old_logp - ref) * mask
            token_rewards = token_rewards - alg.kl_coef * kl_tok
            kl = float(kl_tok.sum() / mask.sum().clamp(min=1.0))  # float() waits for the GPU
        ref_s = time.perf_counter() - t0
        last = (mask.sum(-1).long() - 1).clamp(min=0)
        token_rewards[torch.arange(len(last), device=last.device), last] += rewards.to(token_rewards.dtype)
        adv, returns = gae(token_rewards, old_v, mask, alg.gamma, alg.lam)
        adv = masked_whiten(adv, mask)

        set_lr(self.optimizer, lr)
        set_lr(self.critic_optimizer, critic_lr)
        losses, vlosses, norms, cnorms, clips = [], [], [], [], []
        for mb in minibatch_groups(len(rollout.texts), group_size, alg.mini_batches) * epochs:
            n_tok = mask[mb].sum().clamp(min=1.0)
            self.optimizer.zero_grad(set_to_none=True)
            self.critic_optimizer.zero_grad(set_to_none=True)
            loss_sum = vloss_sum = clip_sum = 0.0
            for idx, sub, m in micro_batches(rollout, mb, alg.micro_batch_responses):
                logp = self._logprobs(self.lm.model, sub, compute_dtype)
                pg, clipped = clipped_pg(logp, old_logp[idx], adv[idx], alg.clip_eps)
                loss = (pg * m).sum() / n_tok
                loss.backward()
                v = self.critic.values(sub, compute_dtype, dev)
                v_clip = old_v[idx] + (v - old_v[idx]).clamp(-alg.value_clip, alg.value_clip)
                ret = returns[idx]
                vl = 0.5 * torch.maximum((v - ret) ** 2, (v_clip - ret) ** 2)
                vloss = (vl * m).sum() / n_tok
                vloss.backward()
                loss_sum += float(loss.detach())
                vloss_sum += float(vloss.detach())
                clip_sum += float((clipped * m).sum())
            check_finite(loss_sum, "the policy loss", step)
            check_finite(vloss_sum, "the value loss", step)
            grad_clip = self.recipe.optimizer.grad_clip
            norms.append(clip_and_norm(self.params, grad_clip, "the actor", step))
            cnorms.append(clip_and_norm(self.critic_params, grad_clip, "the critic", step))
            self.optimizer.step()
            self.critic_optimizer.step()
            losses.append(loss_sum)
            vlosses.append(vloss_sum)
            clips.append(clip_sum / float(n_tok))
        n = len(losses)
        return UpdateStats(
            loss=sum(losses) / n,
            grad_norm=sum(norms) / n,
            kl=kl,
            critic_grad_norm=sum(cnorms) / n,
            value_loss=sum(vlosses) / n,
            clip_frac=sum(clips) / n,
            ref_s=ref_s,
        )
