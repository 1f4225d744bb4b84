"""`batchtune tune`: probe, profile-gen and recommend in a row on one recipe. The stages run here; a
display (the CLI's) is told as each starts and ends, and draws what it wants of them."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from batchtune.analysis.decide.recommend import Recommendation
from batchtune.analysis.system.hardware import RooflinePrediction
from batchtune.analysis.system.profile import ProfileResult
from batchtune.events import ProbeEvents, SweepProgress
from batchtune.recipe.schema import Recipe

if TYPE_CHECKING:
    from batchtune.measure.branched import BranchedProbeResult
    from batchtune.measure.probe import ProbeResult


class TuneDisplay(Protocol):
    """What `tune` tells as it goes: a progress callback per measuring stage, then its result."""

    def probing(self) -> AbstractContextManager[ProbeEvents | None]: ...

    def probed(self, result: ProbeResult | BranchedProbeResult) -> None: ...

    def profiling(self) -> AbstractContextManager[SweepProgress | None]: ...

    def profiled(self, result: ProfileResult | RooflinePrediction | None, plots: list[Path]) -> None: ...


@dataclass(frozen=True)
class Tuned:
    """The three stages' results: the probe, the profile (None where nothing is generated: the
    probe's own step times are the throughput), the recommendation and its emitted config, and
    the full run the recipe states (samples; 0 = none) with why probe.mode = "auto" chose the probe."""

    probe: ProbeResult | BranchedProbeResult
    profile: ProfileResult | RooflinePrediction | None
    recommendation: Recommendation
    emitted: str | None
    emitted_values: Any
    stated_run: tuple[int, str]


def tune(cfg: Recipe, display: TuneDisplay, *, emit: str | None, gpus: int, gpus_per_node: int) -> Tuned:
    """Probe ``cfg`` (a kind `recommend` ranks), profile this machine where the study generates,
    then recommend from both, with ``emit``'s trainer config."""
    from batchtune.measure.probe_size import full_run_samples
    from batchtune.workflow import probe_ranked, profile
    from batchtune.workflow.recommend import recommend_for_recipe
    from batchtune.workflow.study import study_for

    with display.probing() as progress:
        result = probe_ranked(cfg, progress)
    display.probed(result)
    measured: ProfileResult | RooflinePrediction | None = None
    plots: list[Path] = []
    if study_for(cfg).profile_gen:
        with display.profiling() as sweep:
            measured, plots = profile(cfg, sweep)
    display.profiled(measured, plots)
    rec, emitted, values = recommend_for_recipe(cfg, "auto", emit, gpus, gpus_per_node)
    return Tuned(result, measured, rec, emitted, values, (full_run_samples(cfg), cfg.probe_choice))
