"""Profile results and their analysis: everything that needs only stored ThroughputPoints and the
recipe (no engine), so a profile can be re-analysed from records on disk (docs/method.md §4).

    analyse_throughput(points, recipe)   -> ProfileResult (knee, fit, roofline fraction, train fit)

The model's shape comes with the profile's records (stored by measure/profile.py); nothing here
builds or loads a model. Which hardware the roofline is drawn for, and the roofline prediction for
hardware the user does not have, are ``hardware.py``'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchtune.analysis.system.contention import contention_note, median_other_cores
from batchtune.analysis.system.hardware import SIMULATED_DEVICE, model_shape, resolve_hardware
from batchtune.analysis.system.knee import Knee, find_knee
from batchtune.analysis.system.roofline import Hardware, RooflinePoint, fraction_of_bound
from batchtune.analysis.system.throughput import (
    GenThroughputFit,
    TrainTimeFit,
    fit_gen_throughput,
    fit_train_time,
)
from batchtune.codec import to_jsonable
from batchtune.errors import AnalysisError
from batchtune.recipe.schema import Recipe
from batchtune.records.types import ModelInfo, ThroughputPoint

# ---- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModeProfile:
    """One generation mode's sweep and its analysis.

    ``points`` holds every stored point of the mode, ascending, failed ones included; the knee and
    fit use the ``ok`` ones (responses/s). ``roofline`` pairs each ok point's output tokens/s with
    the decode bound at its concurrency and mean context (prompt + half the mean response).
    """

    mode: str
    points: tuple[ThroughputPoint, ...]
    ceiling: int | None  # the concurrency that ran out of memory (sweep stopped there)
    knee: Knee | None
    fit: GenThroughputFit | None
    roofline: tuple[RooflinePoint, ...] = ()
    note: str = ""  # why the knee, fit or roofline is missing; a failed point's message

    @property
    def ok_points(self) -> tuple[ThroughputPoint, ...]:
        return tuple(p for p in self.points if p.status == "ok")

    @property
    def kv_ceiling(self) -> int | None:
        """The least concurrency at which vLLM queued or preempted: its KV cache held fewer."""
        return min((p.concurrency for p in self.ok_points if p.queued > 0 or p.preemptions > 0), default=None)

    @property
    def critical_concurrency(self) -> int | None:
        return None if self.knee is None else int(self.knee.concurrency)

    @property
    def knee_fraction_of_bound(self) -> float | None:
        """Measured / roofline-bound decode throughput at the knee (docs/method.md §4 target: >= 0.7)."""
        if self.knee is None:
            return None
        for rp in self.roofline:
            if rp.concurrency == self.knee.concurrency:
                return rp.fraction_of_bound
        return None


@dataclass(frozen=True)
class ProfileResult:
    """A whole profile: per-mode sweeps, training step times, and what the hardware allows."""

    profile_id: str
    backend: str
    model: str
    device: str  # what the points were measured on: "cpu", "NVIDIA H200", ...
    modes: dict[str, ModeProfile]
    train_points: tuple[ThroughputPoint, ...]
    train_fit: TrainTimeFit | None
    hardware: Hardware | None  # the roofline's hardware; None = no roofline
    roofline_note: str
    model_info: ModelInfo | None
    train_note: str = ""
    wall_s: float = 0.0
    is_prediction: bool = False  # measured, unlike RooflinePrediction
    other_cores: float = math.nan  # median CPU cores other processes kept busy over its points
    cpu_cores: int = 0  # the machine's CPU cores (0: not recorded)
    retimed: str = ""  # how a contended profile was timed again (measure/profile_retime.retime_note)

    @property
    def contention_note(self) -> str | None:
        """Why its times may not be this machine's (None when quiet or unknown, and for a simulated
        engine's computed times, which no load can slow)."""
        if self.device == SIMULATED_DEVICE:
            return None
        return contention_note(self.other_cores, self.cpu_cores)

    def to_dict(self) -> dict[str, Any]:
        modes = {}
        for name, m in self.modes.items():
            modes[name] = {
                "critical_concurrency": m.critical_concurrency,
                "knee_fraction_of_bound": m.knee_fraction_of_bound,
                "ceiling": m.ceiling,
                "kv_ceiling": m.kv_ceiling,
                "knee": to_jsonable(m.knee),
                "fit": to_jsonable(m.fit),
                "roofline": [to_jsonable(r) for r in m.roofline],
                "note": m.note,
                "points": [to_jsonable(p) for p in m.points],
            }
        return to_jsonable(
            {
                "profile_id": self.profile_id,
                "is_prediction": self.is_prediction,
                "backend": self.backend,
                "model": self.model,
                "device": self.device,
                "wall_s": self.wall_s,
                "hardware": self.hardware,
                "roofline_note": self.roofline_note,
                "model_info": self.model_info,
                "modes": modes,
                "train_fit": self.train_fit,
                "train_note": self.train_note,
                "train_points": list(self.train_points),
                "other_cores": self.other_cores,
                "cpu_cores": self.cpu_cores,
                "contended": self.contention_note is not None,
                "retimed": self.retimed,
            }
        )


# ---- analysis from points -----------------------------------------------------------------------


def analyse_throughput(
    points: Sequence[ThroughputPoint],
    recipe: Recipe,
    *,
    profile_id: str | None = None,
    model_info: ModelInfo | None = None,
    wall_s: float = 0.0,
) -> ProfileResult:
    """Rebuild a ProfileResult from stored points (one profile: ``profile_id``, else the last one).

    The model's shape for the roofline is ``model_info``, the one stored with the profile
    (``ResultsStore.model_info``): the analysis reruns from records on disk alone and never builds
    a model.
    """
    if not points:
        raise AnalysisError("no throughput points to analyse; run `batchtune profile-gen` first")
    pid = profile_id if profile_id is not None else points[-1].profile_id
    mine = [p for p in points if p.profile_id == pid]
    if not mine:
        raise AnalysisError(f"no throughput points of profile {pid!r} in the store")
    gen = [p for p in mine if p.kind == "generation"]
    device = mine[0].hardware
    hw, roof_note = resolve_hardware(recipe, device)
    if device == SIMULATED_DEVICE:  # NQM's generation: times computed, not run
        hw, roof_note = None, "no roofline: the simulated generation backend runs on no hardware"
    info = model_info
    if info is None and hw is not None:
        hw, roof_note = None, f"no roofline: no model shape stored with profile {pid!r}; rerun profile-gen"
    modes: dict[str, ModeProfile] = {}
    mode_names = list(dict.fromkeys([*recipe.generation.modes, *(p.mode for p in gen)]))
    for mode in mode_names:
        pts = tuple(sorted((p for p in gen if p.mode == mode), key=lambda p: p.concurrency))
        if pts:
            modes[mode] = _analyse_mode(mode, pts, recipe, hw if info is not None else None, info)
    train = tuple(sorted((p for p in mine if p.kind == "training"), key=lambda p: p.concurrency))
    train_fit, train_note = None, ""
    ok_train = [p for p in train if p.status == "ok"]
    if ok_train:
        try:
            train_fit = fit_train_time(
                [p.concurrency for p in ok_train], [p.step_latency_s for p in ok_train]
            )
        except AnalysisError as exc:
            train_note = str(exc)
    elif train:
        train_note = "no training batch fitted: " + "; ".join(p.message for p in train if p.message)
    first = mine[0]
    return ProfileResult(
        profile_id=pid,
        backend=first.backend,
        model=first.model,
        device=device,
        modes=modes,
        train_points=train,
        train_fit=train_fit,
        hardware=hw,
        roofline_note=roof_note,
        model_info=info,
        train_note=train_note,
        wall_s=wall_s,
        other_cores=median_other_cores(mine),
        cpu_cores=max(p.cpu_cores for p in mine),
    )


def _analyse_mode(
    mode: str, pts: tuple[ThroughputPoint, ...], recipe: Recipe, hw: Hardware | None, info: ModelInfo | None
) -> ModeProfile:
    ok = [p for p in pts if p.status == "ok"]
    oom = [p.concurrency for p in pts if p.status == "oom"]
    ceiling = min(oom) if oom else None
    notes = [f"concurrency {p.concurrency} failed: {p.message}" for p in pts if p.status == "failed"]
    if kv := ModeProfile(mode, pts, None, None, None).kv_ceiling:
        notes.append(
            f"from concurrency {kv} vLLM's KV cache was full and requests waited or were preempted: "
            "throughput there is the cache's (raise generation.kv_cache_bytes on CPU, "
            "gpu_memory_utilization on a GPU)"
        )
    knee = fit = None
    conc = [p.concurrency for p in ok]
    rps = [p.responses_per_s for p in ok]
    if len(set(conc)) >= 2:
        try:
            knee = find_knee(conc, rps, threshold=recipe.generation.knee_threshold, ceiling=ceiling)
        except AnalysisError as exc:
            notes.append(f"no knee: {exc}")
        try:
            fit = fit_gen_throughput(conc, rps)
        except AnalysisError as exc:
            notes.append(f"no fit: {exc}")
    else:
        notes.append(f"no knee: {len(set(conc))} measured concurrency level(s), need >= 2")
    roof: list[RooflinePoint] = []
    if hw is not None and info is not None:
        shape = model_shape(info)
        for p in ok:
            context = p.prompt_tokens + p.mean_output_tokens / 2.0
            roof.extend(fraction_of_bound(shape, hw, p.concurrency, context, p.output_tokens_per_s))
    return ModeProfile(mode, pts, ceiling, knee, fit, tuple(roof), "; ".join(notes))
