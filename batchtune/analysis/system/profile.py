"""Profile results and their analysis: everything that needs only stored ThroughputPoints and the
recipe (no engine), so a profile can be re-analysed from records on disk (docs/method.md §4).

    analyse_throughput(points, recipe)   -> ProfileResult (knee, fit, roofline fraction, train fit)
    roofline_only(recipe, "H100-SXM")    -> RooflinePrediction for hardware the user does not have

The model's shape comes with the profile's records (stored by measure/profile.py); nothing here
builds or loads a model.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchtune.analysis.system.contention import contention_note, median_other_cores
from batchtune.analysis.system.roofline import (
    KNOWN_HARDWARE,
    Hardware,
    ModelShape,
    RooflineCurve,
    RooflinePoint,
    fraction_of_bound,
    get_hardware,
    kv_bytes_per_token,
    max_concurrency_by_memory,
    roofline_curve,
)
from batchtune.analysis.system.throughput import (
    GenThroughputFit,
    Knee,
    TrainTimeFit,
    find_knee,
    fit_gen_throughput,
    fit_train_time,
)
from batchtune.codec import to_jsonable
from batchtune.errors import AnalysisError
from batchtune.recipe.schema import Recipe
from batchtune.records import ModelInfo, ThroughputPoint

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

    @property
    def contention_note(self) -> str | None:
        """Why its times may not be this machine's (None when quiet or unknown)."""
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
            }
        )


@dataclass(frozen=True)
class RooflinePrediction:
    """A roofline bound for hardware the user may not have. A prediction, never a measurement."""

    model_info: ModelInfo
    hardware: Hardware
    context_tokens: float
    curve: RooflineCurve
    max_concurrency_by_memory: float
    is_prediction: bool = True
    note: str = (
        "PREDICTION from the roofline (weights + KV bytes over HBM bandwidth, 2 FLOPs per active "
        "parameter per token over peak FLOP/s): an upper bound no engine reaches; real engines "
        "reach a fraction of it (batchtune's GPU target is 70% at the critical generation batch)."
    )

    def to_dict(self) -> dict[str, Any]:
        c = self.curve
        rows = [
            {
                "concurrency": float(c.concurrency[i]),
                "step_time_bound_s": float(c.step_time_bound_s[i]),
                "tokens_per_s_bound": float(c.tokens_per_s_bound[i]),
                "compute_bound": bool(c.compute_bound[i]),
                "fits_in_memory": bool(c.fits_in_memory[i]),
            }
            for i in range(c.concurrency.size)
        ]
        return to_jsonable(
            {
                "is_prediction": True,
                "note": self.note,
                "model_info": self.model_info,
                "hardware": self.hardware,
                "context_tokens": self.context_tokens,
                "compute_bound_concurrency": c.compute_bound_concurrency,
                "max_concurrency_by_memory": self.max_concurrency_by_memory,
                "points": rows,
            }
        )


# ---- hardware and model shape -------------------------------------------------------------------


SIMULATED_DEVICE = "no hardware (simulated times)"  # backends.nqm.SimulatedGeneration.device_name


def known_hardware_for_device(device: str) -> str | None:
    """Map a CUDA device name (``torch.cuda.get_device_name``) to a KNOWN_HARDWARE key, or None.

    Only unambiguous names are mapped: variants with other clocks or bandwidth (H100 NVL, H200 NVL,
    A100 80GB PCIe) are left to ``hardware.name`` or explicit overrides.
    """
    k = re.sub(r"[^a-z0-9]", "", device.lower())
    if "nvl" in k or "gh200" in k or "gb200" in k:  # Grace superchips: other memory and bandwidth
        return None
    if "h200" in k:
        return "H200"
    if "h100" in k:
        return "H100-PCIe" if "pcie" in k else ("H100-SXM" if ("hbm3" in k or "sxm" in k) else None)
    if "a100" in k:
        if "40gb" in k:
            return "A100-40GB"
        return "A100-80GB" if "sxm" in k and "80gb" in k else None
    if "l40s" in k:
        return "L40S"
    if "b200" in k:
        return "B200"
    return None


def _hardware_overrides(recipe: Recipe) -> dict[str, float]:
    hc = recipe.hardware
    given = {
        "peak_flops": hc.peak_flops,
        "hbm_bytes_per_s": hc.hbm_bytes_per_s,
        "memory_bytes": hc.memory_bytes,
    }
    return {k: float(v) for k, v in given.items() if v > 0}


def resolve_hardware(recipe: Recipe, device: str) -> tuple[Hardware | None, str]:
    """The roofline's hardware for points measured on ``device``, and a note when there is none.

    ``hardware.name`` wins over detection; ``peak_flops``/``hbm_bytes_per_s``/``memory_bytes``
    override table values. Without a table entry both peak figures must be given (memory then
    defaults to the host's RAM: it only matters to memory-fit predictions).
    """
    hc = recipe.hardware
    overrides = _hardware_overrides(recipe)
    name = hc.name if hc.name != "auto" else known_hardware_for_device(device)
    if name:
        try:
            return get_hardware(name, **overrides), ""
        except AnalysisError:
            if not ("peak_flops" in overrides and "hbm_bytes_per_s" in overrides):
                raise
            overrides.setdefault("memory_bytes", _host_memory_bytes())
            return get_hardware(name, **overrides), ""
    if "peak_flops" in overrides and "hbm_bytes_per_s" in overrides:
        overrides.setdefault("memory_bytes", _host_memory_bytes())
        return Hardware(device or "custom", **overrides), ""
    if device in ("", "cpu"):
        return None, (
            "no roofline for CPU: set hardware.peak_flops and hardware.hbm_bytes_per_s "
            "(FLOP/s and memory bytes/s) to compare against one; a knee measured on CPU says "
            "nothing about where a GPU's knee lies"
        )
    return None, (
        f"no roofline: {device!r} is not in the known table ({', '.join(KNOWN_HARDWARE)}); "
        "set hardware.name, or hardware.peak_flops and hardware.hbm_bytes_per_s"
    )


def _host_memory_bytes() -> float:
    import os

    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def model_shape(info: ModelInfo) -> ModelShape:
    kv = kv_bytes_per_token(info.n_layers, info.n_kv_heads, info.head_dim, info.bytes_per_param)
    return ModelShape(info.n_params, info.n_active_params, info.bytes_per_param, kv)


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


# ---- roofline only ------------------------------------------------------------------------------


def roofline_only(
    recipe: Recipe,
    hardware: str | None = None,
    concurrencies: Sequence[float] | None = None,
    context_tokens: float | None = None,
    *,
    model_info: ModelInfo,
) -> RooflinePrediction:
    """Roofline bound of decoding for the recipe's model on ``hardware`` (a KNOWN_HARDWARE name,
    else ``recipe.hardware.name``; the recipe's peak_flops/hbm_bytes_per_s/memory_bytes overrides
    apply only to the recipe's own hardware). No engine runs: a prediction.

    ``model_info`` is the model's shape (measure.profile.model_info_for_recipe builds it from a
    config without loading weights). ``context_tokens`` defaults to prompt + half the maximum
    response, the mean KV length of a fixed-length batch over its decode.
    """
    hc = recipe.hardware
    name = hardware or (hc.name if hc.name != "auto" else None)
    if not name:
        raise AnalysisError(f"roofline_only needs a hardware name; known: {', '.join(KNOWN_HARDWARE)}")
    overrides: dict[str, float] = {}
    if hardware is None or hardware == hc.name:  # the recipe's overrides belong to the recipe's hardware
        overrides = _hardware_overrides(recipe)
    hw = get_hardware(name, **overrides)
    info = model_info
    g = recipe.generation
    ctx = float(context_tokens) if context_tokens is not None else g.prompt_tokens + g.max_new_tokens / 2.0
    conc = list(concurrencies) if concurrencies else sorted(set(g.concurrency))
    shape = model_shape(info)
    curve = roofline_curve(shape, hw, conc, ctx)
    return RooflinePrediction(
        model_info=info,
        hardware=hw,
        context_tokens=ctx,
        curve=curve,
        max_concurrency_by_memory=max_concurrency_by_memory(shape, hw, g.prompt_tokens + g.max_new_tokens),
    )
