"""Every off-policy / async config batchtune emits, gathered for the tests that let the trainers judge
them (tests/integrations/test_packages_async.py, marker ``trainers``): a spread of picks (colocated
and split, k 0 to 4, mini-batches and epochs, sync_every, an in-flight cap, partial rollout, PPO,
an unknown LR, nodes of 8), each as printed and as its ``--out`` file, for every verl async trainer
that can take it."""

from __future__ import annotations

from batchtune.errors import InputError
from batchtune.integrations.emit import emit
from batchtune.integrations.emit_async import VERL_ASYNC_TRAINERS
from batchtune.integrations.emit_base import RecommendationInput
from batchtune.integrations.emit_files import trainer_file
from tests.integrations.packages_cases import Emitted

R = RecommendationInput
SPLIT = {"mode": "async"}

# (label, pick, GPUs, emitter options)
ASYNC_WINNERS: list[tuple[str, RecommendationInput, int, dict]] = [
    ("colocated-k1", R(64, 8, 1e-6, staleness=1), 8, {}),
    (
        "colocated-k2-ppo-epochs",
        R(64, 4, 1e-6, algorithm="ppo", critic_lr=1e-5, mini_batches=2, epochs=2, staleness=2),
        8,
        {},
    ),
    ("split-k0", R(64, 8, 1e-6, rollout_gpus=4, **SPLIT), 8, {}),
    ("split-k1", R(64, 8, 1e-6, staleness=1, rollout_gpus=2, generation_concurrency=128, **SPLIT), 6, {}),
    (
        "split-k2-sync2-cap1-partial-nodes",
        R(
            128,
            8,
            1.4e-6,
            mini_batches=2,
            staleness=2,
            sync_every=2,
            in_flight_cap=1,
            partial_rollout=True,
            rollout_gpus=8,
            gpu_memory_utilization=0.6,
            **SPLIT,
        ),
        16,
        {"gpus_per_node": 8},
    ),  # fmt: skip
    ("split-k4-epochs-no-lr", R(64, 8, float("nan"), mini_batches=4, epochs=2, staleness=4, **SPLIT), 8, {}),
    ("sync-epochs3", R(32, 8, 1e-6, mini_batches=2, epochs=3), 4, {}),
]


def async_emitted(trainer: str) -> list[Emitted]:
    """Each pick the trainer can take, printed and as a file; verl once per async trainer that fits
    (a pick a trainer refuses, with its InputError, is left out: test_emit_async tests the refusals)."""
    out = []
    for label, rec, gpus, options in ASYNC_WINNERS:
        variants: list[dict] = [{}]
        if trainer == "verl":
            variants = [{"async_trainer": v} for v in (VERL_ASYNC_TRAINERS if rec.off_policy else ("v1",))]
        for variant in variants:
            opts = {**options, **variant}
            if trainer == "trl":
                if rec.algorithm == "ppo":
                    continue
                opts.pop("gpus_per_node", None)
            try:
                e = emit(trainer, rec, gpus, **opts)
            except InputError:
                continue
            name = f"{label}-{variant['async_trainer']}" if variant else label
            out.append(Emitted(name, e.text, e.values, opts))
            out.append(Emitted(f"{name}-file", trainer_file(trainer, e.values, e.text), e.values, opts))
    return out
