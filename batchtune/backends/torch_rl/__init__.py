"""The built-in torch RL training backend: GRPO and PPO on any transformers causal LM.

Registered as ``"torch"`` (``batchtune.backends.torch_rl:TorchRLBackend``). Modules, by job:
``tasks`` (prompts, answers, rewards), ``warmstart`` (cached supervised warm start of the tiny
model), ``rollout`` (generation and log-probs), ``grpo`` and ``ppo`` (the updates), ``optim``
(optimisers, clipping), ``trainer`` (the loop that yields StepRecords). See docs/trainer.md.
"""

from __future__ import annotations

from collections.abc import Iterator

from batchtune.backends.spec import RunSpec
from batchtune.records import StepRecord

__all__ = ["TorchRLBackend"]


class TorchRLBackend:
    """GRPO / PPO with model.generate rollouts; CPU or CUDA (bf16 autocast) through the same code."""

    name = "torch"

    def train(self, spec: RunSpec) -> Iterator[StepRecord]:
        from batchtune.backends.torch_rl.trainer import train

        return train(spec)
