"""Backends by name. Built-in ones are registered exactly like a third party's: a lazy
``"module:Class"`` string, imported only when used, so `batchtune --help` never imports an engine.
"""

from __future__ import annotations

import importlib
from typing import Any

from batchtune.errors import BackendError

TRAINING_BACKENDS: dict[str, str] = {
    "torch": "batchtune.backends.torch_rl:TorchRLBackend",
    "nqm": "batchtune.backends.nqm:NQMBackend",
    "command": "batchtune.backends.command:CommandBackend",
    "trl": "batchtune.backends.trl_backend:TRLBackend",
    "pretrain": "batchtune.backends.pretrain_lm:PretrainLMBackend",
}

GENERATION_BACKENDS: dict[str, str] = {
    "transformers": "batchtune.backends.gen_transformers:TransformersGeneration",
    "vllm": "batchtune.backends.gen_vllm:VLLMGeneration",
    "simulated": "batchtune.backends.nqm:SimulatedGeneration",
}

EXTRAS = {"vllm": "vllm", "trl": "trl", "ray": "ray"}


def load(kind: str, name: str) -> Any:
    """Import and return the backend class registered as ``name`` in ``kind`` (training|generation)."""
    table = TRAINING_BACKENDS if kind == "training" else GENERATION_BACKENDS
    if name not in table:
        raise BackendError(f"unknown {kind} backend {name!r}; known: {', '.join(sorted(table))}")
    module_name, _, attr = table[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = EXTRAS.get(name)
        hint = f"; install it with `pip install 'batchtune[{extra}]'`" if extra else ""
        raise BackendError(f"the {name} {kind} backend needs {exc.name or exc}{hint}") from None
    return getattr(module, attr)


def checkpoint_problem(recipe: Any) -> str | None:
    """Why ``recipe``'s training backend cannot save and resume checkpoints (branched probes,
    schedules), or None when it can. A backend says so with ``supports_checkpoints`` or, when it
    depends on the recipe (the command backend), a ``checkpoint_support(recipe)`` classmethod."""
    name = recipe.backend.training
    cls = load("training", name)
    check = getattr(cls, "checkpoint_support", None)
    if check is not None:
        problem: str | None = check(recipe)
        return problem
    if getattr(cls, "supports_checkpoints", False):
        return None
    return f"the {name} training backend cannot start from a checkpoint"
