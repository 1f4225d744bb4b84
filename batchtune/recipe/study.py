"""The study kind a recipe names: the one place that reads `backend.training` and `probe.mode`.

A study kind says what is measured (RL responses or pre-training tokens) and how (a grid of full
runs or one trunk with short branches). Everything else asks the kind (`recipe.study.pretrain`,
`recipe.study.branched`) instead of comparing the recipe's strings; `batchtune.workflow.study` maps
each kind to the functions that plan, measure, analyse and report it. A new kind (async RL, next) is
one more member here and one more row there.
"""

from __future__ import annotations

import enum
from typing import Protocol


class _Backend(Protocol):
    @property
    def training(self) -> str: ...


class _Probe(Protocol):
    @property
    def mode(self) -> str: ...


class _StudyRecipe(Protocol):
    @property
    def backend(self) -> _Backend: ...

    @property
    def probe(self) -> _Probe: ...


class StudyKind(enum.Enum):
    """What a probe measures and how; the value is the name shown in plans and JSON."""

    RL_GRID = "rl-grid"
    RL_BRANCHED = "rl-branched"
    PRETRAIN_GRID = "pretrain-grid"
    PRETRAIN_BRANCHED = "pretrain-branched"

    @property
    def pretrain(self) -> bool:
        """Pre-training (tokens, loss) rather than RL (responses, reward)."""
        return self in (StudyKind.PRETRAIN_GRID, StudyKind.PRETRAIN_BRANCHED)

    @property
    def branched(self) -> bool:
        """One trunk with short branches per batch rather than a grid of full runs."""
        return self in (StudyKind.RL_BRANCHED, StudyKind.PRETRAIN_BRANCHED)

    @property
    def sample_unit(self) -> str:
        """What a sample (and a batch) counts."""
        return "tokens" if self.pretrain else "samples"


PRETRAIN_BACKEND = "pretrain"  # the backend name that makes a study a pre-training study
BRANCHED_MODE = "branched"  # the probe mode that makes a study branched
AUTO_MODE = "auto"  # grid or branched, chosen against the stated full run (measure/probe_size.resolved)


def kind_of(training: str, mode: str) -> StudyKind:
    """The study kind of a backend name and a probe mode."""
    pretrain = training == PRETRAIN_BACKEND
    branched = mode == BRANCHED_MODE
    if pretrain:
        return StudyKind.PRETRAIN_BRANCHED if branched else StudyKind.PRETRAIN_GRID
    return StudyKind.RL_BRANCHED if branched else StudyKind.RL_GRID


def study_of(recipe: _StudyRecipe) -> StudyKind:
    """The study kind a recipe names (its `backend.training` and `probe.mode`). An "auto" not yet
    resolved (measure/probe_size.resolved, which the workflow applies to every recipe it loads)
    reads as the grid, the choice auto makes when nothing else is known."""
    mode = recipe.probe.mode
    return kind_of(recipe.backend.training, "grid" if mode == AUTO_MODE else mode)


