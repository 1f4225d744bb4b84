"""The roofline's hardware: which hardware a profile's points were measured on (the recipe's
``hardware`` table, else the CUDA device name), the model's shape, and the roofline prediction for
hardware the user does not have (docs/method.md §4).

    resolve_hardware(recipe, "NVIDIA H200")  -> (Hardware, "") or (None, why there is no roofline)
    roofline_only(recipe, "H100-SXM")        -> RooflinePrediction (no engine runs)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchtune.analysis.system.roofline import (
    KNOWN_HARDWARE,
    Hardware,
    ModelShape,
    RooflineCurve,
    get_hardware,
    kv_bytes_per_token,
    max_concurrency_by_memory,
    roofline_curve,
)
from batchtune.codec import to_jsonable
from batchtune.errors import AnalysisError
from batchtune.recipe.schema import Recipe
from batchtune.records.types import ModelInfo

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


def hardware_overrides(recipe: Recipe) -> dict[str, float]:
    """The hardware figures the recipe gives (``hardware.peak_flops``, ...), over the table's."""
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
    overrides = hardware_overrides(recipe)
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
        overrides = hardware_overrides(recipe)
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
