"""The study map: for each study kind (batchtune.recipe.study), what plans, runs and ranks it.

    kind               plan (before it runs)      probe                   ranked by time-to-target
    rl-grid            measure.preview            measure.probe           yes (profile-gen throughput)
    rl-branched        measure.preview_branched   measure.branched        yes (profile-gen throughput)
    pretrain-grid      measure.preview (tokens)   measure.pretrain_probe  no: B_opt and B_min per loss
    pretrain-branched  measure.preview_branched   measure.branched        yes (the probe's step times)

Refinement (``refines`` below): the pretrain-grid probe adds batches between grid points where B_opt
sits between them (``probe.refine``, measure/pretrain_refine.py), the rl-grid probe prompts where
the critical batch's 1+tol crossing does (``probe.refine_rl``, measure/rl_refine.py; its runs are
read from the store by the analysis and recommend); each plan bounds its rounds' cost.

The workflow asks this map, never the recipe's strings; a new kind is one more row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from batchtune.events import ProbeEvents
from batchtune.recipe.schema import Recipe
from batchtune.recipe.study import StudyKind

if TYPE_CHECKING:
    from batchtune.measure.branched import BranchedProbeResult
    from batchtune.measure.pretrain_probe import PretrainProbeResult
    from batchtune.measure.preview import PlanPreview
    from batchtune.measure.preview_branched import BranchedPlanPreview
    from batchtune.measure.probe import ProbeResult

Preview = Union["PlanPreview", "BranchedPlanPreview"]
ProbeOutcome = Union["ProbeResult", "BranchedProbeResult", "PretrainProbeResult"]


def _grid_preview(cfg: Recipe, time_steps: int | None) -> PlanPreview:
    from batchtune.measure.preview import plan_preview

    return plan_preview(cfg, time_steps)


def _branched_preview(cfg: Recipe, time_steps: int | None) -> BranchedPlanPreview:
    from batchtune.measure.preview_branched import branched_plan_preview

    return branched_plan_preview(cfg, time_steps)


def _grid_probe(cfg: Recipe, progress: ProbeEvents | None) -> ProbeResult:
    from batchtune.measure.probe import run_probe

    return run_probe(cfg, progress=progress)


def _branched_probe(cfg: Recipe, progress: ProbeEvents | None) -> BranchedProbeResult:
    from batchtune.measure.branched import run_branched_probe

    return run_branched_probe(cfg, progress)


def _pretrain_grid_probe(cfg: Recipe, progress: ProbeEvents | None) -> PretrainProbeResult:
    """The token-batch grid, analysed, with B_opt and B_min drawn against the target loss."""
    from batchtune.measure.pretrain_probe import run_pretrain_probe
    from batchtune.records.store import ResultsStore
    from batchtune.report.pretrain_grid import plot_bopt_bmin

    result = run_pretrain_probe(cfg, progress, refine=True)  # + the refinement rounds (probe.refine)
    plot = plot_bopt_bmin(result.analysis, ResultsStore.of(cfg).plots_dir / "bopt_bmin.png")
    return dataclasses.replace(result, plot_path=plot)


@dataclass(frozen=True)
class Study:
    """What differs between study kinds, in the order a study runs."""

    kind: StudyKind
    preview: Callable[[Recipe, int | None], Preview]  # the probe's cost before it runs
    probe: Callable[[Recipe, ProbeEvents | None], ProbeOutcome]  # run or resume it
    profile_gen: bool  # `tune` runs profile-gen between probe and recommend
    ranked: bool  # `recommend` ranks its candidates by predicted time-to-target
    refines: str = ""  # what its probe's refinement rounds pin down between grid points; "" = none


_ROWS = (
    Study(
        StudyKind.RL_GRID,
        _grid_preview,
        _grid_probe,
        profile_gen=True,
        ranked=True,
        refines="the critical batch's 1+tol crossing",
    ),
    Study(StudyKind.RL_BRANCHED, _branched_preview, _branched_probe, profile_gen=True, ranked=True),
    Study(
        StudyKind.PRETRAIN_GRID,
        _grid_preview,
        _pretrain_grid_probe,
        profile_gen=False,
        ranked=False,
        refines="B_opt per target loss",
    ),
    Study(StudyKind.PRETRAIN_BRANCHED, _branched_preview, _branched_probe, profile_gen=False, ranked=True),
)
STUDIES: dict[StudyKind, Study] = {row.kind: row for row in _ROWS}


def study_for(cfg: Recipe) -> Study:
    """The row of the map for the kind ``cfg`` names."""
    return STUDIES[cfg.study]
