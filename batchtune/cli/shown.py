"""How the measuring commands show what the workflow returned: the probe's choice and notes, the
profile, and tune's stages as they finish (workflow.tune.TuneDisplay)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchtune.cli.app import console
from batchtune.errors import AnalysisError

if TYPE_CHECKING:
    from batchtune.measure.branched import BranchedProbeResult
    from batchtune.measure.probe import ProbeResult


def say_choice(cfg: Any, json_out: bool) -> None:
    """Why probe.mode = "auto" chose this probe (recipe.probe_choice), before it runs."""
    if cfg.probe_choice and not json_out:
        console.print(f"Probe mode: {cfg.probe_choice}", highlight=False, markup=False)


def not_estimated(eff: Any) -> str | None:
    """Why a probe estimated no critical batch (None when it did): the reference never reached the
    target, or too few batches have a usable estimate. The probe then exits 3, as recommend does."""
    crit = eff.critical
    if crit is not None and crit.batch is not None:
        return None
    if crit is not None:
        return f"critical training batch not estimated: {crit.reason}"
    why = next((n for n in eff.notes if n.startswith("critical batch not estimated")), None)
    return why or "critical training batch not estimated"


def exit_if_not_estimated(reason: str | None) -> None:
    """After the results are shown: exit 3 with one line on stderr when nothing was estimated."""
    if reason is not None:
        raise AnalysisError(reason)


def probe_notes(result: ProbeResult | BranchedProbeResult) -> tuple[str, ...]:
    """What the workflow noted after a grid probe (e.g. a plot a read-only directory refused)."""
    from batchtune.measure.probe import ProbeResult

    return result.notes if isinstance(result, ProbeResult) else ()


def plot_lines(result: ProbeResult | BranchedProbeResult) -> None:
    if result.plot_path:
        console.print(f"Learning curves: {result.plot_path}")
    for note in probe_notes(result):
        console.print(f"Note: {note}", highlight=False, markup=False)


def refinement_json(result: ProbeResult | BranchedProbeResult) -> dict[str, Any]:
    """A grid probe's refinement rounds (measure/rl_refine.py) for --json; {} when it ran none."""
    import dataclasses

    from batchtune.measure.probe import ProbeResult

    if not isinstance(result, ProbeResult) or not result.refinement:
        return {}
    return {"refinement": [dataclasses.asdict(r) for r in result.refinement]}


def branched_json(result: ProbeResult | BranchedProbeResult) -> dict[str, Any]:
    from batchtune.measure.branched import BranchedProbeResult

    if not isinstance(result, BranchedProbeResult):
        return {}
    from batchtune.report.branched import branched_to_dict

    return {"branched": branched_to_dict(result.summary)}


def show_profile(result: Any, paths: list[Path], *, roofline_only: bool = False) -> None:
    from batchtune.report.profile import render_prediction, render_profile

    (render_prediction if roofline_only else render_profile)(console, result)
    for p in paths:
        console.print(f"Plot: {p}")


class TuneScreen:
    """tune's stages in the terminal (workflow.tune.TuneDisplay): a rule before each, the probe's
    table and the profile as they finish; nothing but the final JSON with --json."""

    def __init__(self, json_out: bool) -> None:
        self.json_out = json_out

    def probing(self) -> AbstractContextManager[Any]:
        from batchtune.report.progress import probe_progress

        if not self.json_out:
            console.rule("1/3 probe: sample efficiency")
        return probe_progress(console, enabled=not self.json_out)

    def probed(self, result: ProbeResult | BranchedProbeResult) -> None:
        from batchtune.report.terminal import render_efficiency

        if not self.json_out:
            render_efficiency(console, result.efficiency)
            plot_lines(result)
            console.rule("2/3 profile-gen: system efficiency")

    def profiling(self) -> AbstractContextManager[Any]:
        from batchtune.report.progress import simple_progress

        return simple_progress(console, "profiling", enabled=not self.json_out)

    def profiled(self, result: Any, plots: list[Path]) -> None:
        if self.json_out:
            return
        if result is not None:
            show_profile(result, plots)
        else:  # nothing is generated: the probe's own step times are the throughput
            console.print(
                "pre-training generates nothing: the probe's timed training steps are the throughput"
            )
        console.rule("3/3 recommend: time-to-target")
