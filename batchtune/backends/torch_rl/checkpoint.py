"""Checkpoints of a GRPO/PPO run, for branched probes (measure/branched.py, issue 10).

One file, ``<ckpt-dir>/state.pt``, written atomically: the policy's weights, the optimiser state(s)
(moments only: a branch keeps its own LR, betas and eps, which its batch sets), the PPO critic, the
prompt sampler's position (its generator and the rest of the current epoch), torch's RNG (CPU and,
on a GPU, CUDA) and the counters (step, samples, tokens, last evaluation).

Seeds: a branch at the trunk's own seed continues the trunk exactly (same prompts, same sampling);
a branch at another seed keeps the weights and optimiser state but draws its prompts and samples
from fresh generators seeded by (seed, checkpoint samples), so the seeds of one checkpoint are
independent replicates, and every batch size at one seed shares its stream (paired comparisons).
The frozen reference policy (KL) is the warm-started initial model in trunk and branches alike.
The file holds tensors and plain containers only and is read with ``weights_only=True``
(backends/checkpoint_file.py): a results directory cannot run code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from batchtune.backends.checkpoint_file import read_state
from batchtune.backends.spec import branch_seed


@dataclass
class Counters:
    step: int = 0
    samples: int = 0
    tokens: int = 0
    last_eval: int = 0


def state_file(path: Path) -> Path:
    """A checkpoint is a folder (``ckpt-<samples>``) holding ``state.pt``; a ``.pt`` path is the file."""
    return path if path.suffix == ".pt" else path / "state.pt"


def _optimizer_states(learner: Any) -> dict[str, Any]:
    out = {"actor": learner.optimizer.state_dict()}
    if getattr(learner, "critic_optimizer", None) is not None:
        out["critic"] = learner.critic_optimizer.state_dict()
    return out


def save(path: Path, learner: Any, sampler: Any, counters: Counters, seed: int) -> Path:
    file = state_file(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "policy": learner.lm.model.state_dict(),
        "optimizers": _optimizer_states(learner),
        "critic": learner.critic.state_dict() if hasattr(learner, "critic") else None,
        "sampler_gen": sampler.gen.get_state(),
        "sampler_order": list(sampler.order),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        "counters": vars(counters).copy(),
        "seed": seed,
    }
    tmp = file.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(file)
    return file


def _load_moments(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """The saved per-parameter state under this optimiser's own hyperparameters (param_groups)."""
    current = optimizer.state_dict()
    current["state"] = saved["state"]
    optimizer.load_state_dict(current)


def load(path: Path, learner: Any, sampler: Any, seed: int) -> Counters:
    """Restore ``path`` into a freshly built learner and sampler; returns the counters."""
    file = state_file(path)
    state = read_state(file)  # tensors and plain containers only: a planted pickle is refused
    learner.lm.model.load_state_dict(state["policy"])
    _load_moments(learner.optimizer, state["optimizers"]["actor"])
    if state["critic"] is not None and hasattr(learner, "critic"):
        learner.critic.load_state_dict(state["critic"])
        _load_moments(learner.critic_optimizer, state["optimizers"]["critic"])
    counters = Counters(**state["counters"])
    if seed == state["seed"]:
        sampler.gen.set_state(state["sampler_gen"])
        sampler.order = list(state["sampler_order"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
    else:
        fresh = branch_seed(seed, counters.samples)
        sampler.gen.manual_seed(fresh)
        sampler.order = []
        torch.manual_seed(fresh)
    return counters
