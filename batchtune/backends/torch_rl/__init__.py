"""The built-in torch RL training backend: GRPO and PPO on any transformers causal LM.

Registered as ``"torch"`` (``batchtune.backends.torch_rl:TorchRLBackend``). Modules, by job:
``tasks`` (prompts, answers, rewards), ``warmstart`` (cached supervised warm start of the tiny
model), ``rollout`` (generation and log-probs), ``grpo`` and ``ppo`` (the updates), ``optim``
(optimisers, clipping), ``trainer`` (the loop that yields StepRecords), ``checkpoint`` (a
run's state, for branched probes). See docs/trainer.md.
"""

from __future__ import annotations

from collections.abc import Iterator

from batchtune.backends.spec import RunSpec
from batchtune.recipe.schema import Recipe
from batchtune.records.types import StepRecord

__all__ = ["TorchRLBackend"]


class TorchRLBackend:
    """GRPO / PPO with model.generate rollouts; CPU or CUDA (bf16 autocast) through the same code."""

    name = "torch"
    supports_checkpoints = True  # checkpoint.py: branched probes start from a trunk's state

    @staticmethod
    def metric_ranges(recipe: Recipe) -> dict[str, tuple[float, float]]:
        """The declared range of each metric, so a probe can refuse an unreachable target up front.

        Built-in tasks score per-character accuracy (tasks.char_reward): in [0, 1]. A user's reward
        function declares nothing."""
        from batchtune.backends.torch_rl.tasks import BUILTIN_TASKS

        if recipe.task.name not in BUILTIN_TASKS:
            return {}
        return {"reward": (0.0, 1.0), "eval_reward": (0.0, 1.0)}

    def train(self, spec: RunSpec) -> Iterator[StepRecord]:
        if spec.recipe.algorithm.mode == "async":  # a rollout process beside this trainer
            from batchtune.backends.torch_rl.async_run import train_async

            return train_async(spec)
        from batchtune.backends.torch_rl.trainer import train

        return train(spec)
