"""Roofline bounds for decoding: the physical limit a generation engine cannot beat (docs/method.md §4).

Per decode step with ``c`` concurrent sequences, each producing one token:

    t_step >= max(bytes_read / hbm_bytes_per_s, 2 * n_active_params * c / peak_flops)
    bytes_read = n_params * bytes_per_param + c * context_tokens * kv_bytes_per_token

(2 FLOPs per active parameter per token: one multiply, one add; the weight-stationary roofline
of Williams et al. 2009 applied to decoding.) Attention score FLOPs (~4 * n_layers * d_model *
context per token) are left out: small next to the weight FLOPs at RL context lengths, and
memory-bound anyway. Every number here is a bound or a prediction, never a measurement.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

import numpy as np

from batchtune.errors import AnalysisError, InputError


@dataclass(frozen=True)
class Hardware:
    """One accelerator: dense bf16 tensor FLOP/s (no 2:4 sparsity), HBM bandwidth, HBM capacity."""

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    memory_bytes: float

    def __post_init__(self) -> None:
        for field in ("peak_flops", "hbm_bytes_per_s", "memory_bytes"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float, np.number)) and math.isfinite(value) and value > 0):
                raise AnalysisError(f"hardware {self.name!r}: {field} must be > 0, got {value!r}.")


# Vendor datasheet figures, dense bf16 (the "with sparsity" figures are twice these), HBM in
# decimal bytes as the vendor states them:
#   NVIDIA H200 datasheet (SXM): 989 TFLOP/s bf16 dense, 4.8 TB/s, 141 GB.
#   NVIDIA H100 datasheet: SXM 989 TFLOP/s, 3.35 TB/s, 80 GB; PCIe 756 TFLOP/s, 2.0 TB/s, 80 GB.
#   NVIDIA A100 datasheet: 312 TFLOP/s bf16; 80GB SXM 2.039 TB/s; 40GB 1.555 TB/s.
#   NVIDIA L40S datasheet: 362 TFLOP/s bf16 dense, 864 GB/s GDDR6, 48 GB.
#   NVIDIA HGX B200 datasheet (per GPU): 2.25 PFLOP/s bf16 dense, 8 TB/s, 192 GB.
KNOWN_HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in (
        Hardware("H200", 989e12, 4.8e12, 141e9),
        Hardware("H100-SXM", 989e12, 3.35e12, 80e9),
        Hardware("H100-PCIe", 756e12, 2.0e12, 80e9),
        Hardware("A100-80GB", 312e12, 2.039e12, 80e9),
        Hardware("A100-40GB", 312e12, 1.555e12, 40e9),
        Hardware("L40S", 362e12, 0.864e12, 48e9),
        Hardware("B200", 2.25e15, 8e12, 192e9),
    )
}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def get_hardware(name: str, **overrides: float) -> Hardware:
    """Look up ``name`` case-insensitively (``"h100_sxm"`` finds ``"H100-SXM"``), then override.

    Overrides replace fields (``peak_flops``, ``hbm_bytes_per_s``, ``memory_bytes``), e.g. for a
    power-capped card. An unknown name is accepted only when all three fields are given.
    """
    fields = {"peak_flops", "hbm_bytes_per_s", "memory_bytes"}
    unknown = set(overrides) - fields
    if unknown:
        raise AnalysisError(f"unknown hardware field(s) {sorted(unknown)}; known fields: {sorted(fields)}.")
    matches = [h for h in KNOWN_HARDWARE.values() if _key(h.name) == _key(name)]
    if matches:
        return dataclasses.replace(matches[0], **overrides)  # type: ignore[arg-type]
    if set(overrides) == fields:
        return Hardware(name, **overrides)
    raise InputError(  # a typo in --hardware is an input error (exit 2), like any other
        f"unknown hardware {name!r}; known: {', '.join(KNOWN_HARDWARE)}. For other hardware give "
        "peak_flops (dense bf16 FLOP/s), hbm_bytes_per_s and memory_bytes."
    )


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_elem: float = 2) -> float:
    """KV-cache bytes per token: ``2 (K and V) * n_layers * n_kv_heads * head_dim * bytes``."""
    return float(2 * n_layers * n_kv_heads * head_dim * bytes_per_elem)


@dataclass(frozen=True)
class ModelShape:
    """What decoding reads and computes. ``n_active_params == n_params`` for a dense model.

    For an MoE, ``n_active_params`` is the parameters one token touches (shared + top-k experts);
    weight bytes use ``n_params``: at the concurrencies that matter every expert is hit by some
    token in the step, so every expert is read (at very small concurrency this overstates the
    bytes and the bound is loose).
    """

    n_params: float
    n_active_params: float
    bytes_per_param: float = 2.0
    kv_bytes_per_token: float = 0.0

    def __post_init__(self) -> None:
        for field in ("n_params", "n_active_params", "bytes_per_param"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value > 0):
                raise AnalysisError(f"model shape: {field} must be > 0, got {value!r}.")
        if not (math.isfinite(self.kv_bytes_per_token) and self.kv_bytes_per_token >= 0):
            raise AnalysisError(f"kv_bytes_per_token must be >= 0, got {self.kv_bytes_per_token}.")
        if self.n_active_params > self.n_params:
            raise AnalysisError(
                f"n_active_params ({self.n_active_params:g}) exceeds n_params ({self.n_params:g})."
            )

    @classmethod
    def dense(
        cls, n_params: float, kv_bytes_per_token: float = 0.0, bytes_per_param: float = 2.0
    ) -> ModelShape:
        return cls(n_params, n_params, bytes_per_param, kv_bytes_per_token)

    @property
    def weight_bytes(self) -> float:
        return self.n_params * self.bytes_per_param


def _concurrency_array(concurrency: object, context_tokens: float) -> np.ndarray:
    c = np.asarray(concurrency, dtype=float)
    if not np.all(np.isfinite(c)) or np.any(c <= 0):
        raise AnalysisError(f"concurrency must be finite and > 0, got {c.tolist()}.")
    if not (math.isfinite(context_tokens) and context_tokens >= 0):
        raise AnalysisError(f"context_tokens must be >= 0, got {context_tokens}.")
    return c


def _step_time_bound(shape: ModelShape, hw: Hardware, c: np.ndarray, context_tokens: float):
    bytes_read = shape.weight_bytes + c * context_tokens * shape.kv_bytes_per_token
    memory_s = bytes_read / hw.hbm_bytes_per_s
    compute_s = 2.0 * shape.n_active_params * c / hw.peak_flops
    return np.maximum(memory_s, compute_s), compute_s >= memory_s


def decode_step_time_bound_s(
    shape: ModelShape, hw: Hardware, concurrency: float, context_tokens: float
) -> float:
    """Lower bound on one decode step, seconds (module docstring formula).

    ``context_tokens`` is the mean KV length per sequence (prompt + tokens generated so far).
    """
    c = _concurrency_array(concurrency, context_tokens)
    return float(_step_time_bound(shape, hw, c, context_tokens)[0])


def decode_tokens_per_s_bound(
    shape: ModelShape, hw: Hardware, concurrency: float, context_tokens: float
) -> float:
    """Upper bound on decode throughput, tokens/s: ``concurrency / t_step_bound``."""
    return float(concurrency) / decode_step_time_bound_s(shape, hw, concurrency, context_tokens)


def compute_bound_concurrency(hw: Hardware, shape: ModelShape, context_tokens: float = 0.0) -> float:
    """Concurrency above which decoding is compute-bound (weights-only roofline crossing).

    Setting ``n_params * bytes_per_param / hbm = 2 n_active c / peak`` gives
    ``c* = peak / hbm * (n_params / n_active) * (bytes_per_param / 2)``: ~206 on an H200 and ~295
    on an H100 SXM for dense bf16 (the 2 FLOPs and 2 bytes per parameter cancel), 16x more for a
    128-expert/8-active MoE (docs/method.md §4). With ``context_tokens > 0`` the KV reads, which grow with
    concurrency too, are included: ``c* = W / hbm / (2 n_active / peak - ctx * kv / hbm)``, inf
    when each sequence's KV read costs more than its FLOPs (decode never turns compute-bound).
    """
    _concurrency_array(1.0, context_tokens)
    per_seq_compute_s = 2.0 * shape.n_active_params / hw.peak_flops
    per_seq_kv_s = context_tokens * shape.kv_bytes_per_token / hw.hbm_bytes_per_s
    margin = per_seq_compute_s - per_seq_kv_s
    if margin <= 0:
        return math.inf
    return shape.weight_bytes / hw.hbm_bytes_per_s / margin


def max_concurrency_by_memory(
    shape: ModelShape, hw: Hardware, context_tokens: float, reserve_fraction: float = 0.1
) -> float:
    """Sequences whose KV cache fits beside the weights on one device.

    ``(memory_bytes * (1 - reserve_fraction) - weight_bytes) / (context_tokens * kv_bytes)``;
    ``reserve_fraction`` stands in for activations and allocator slack (we choose 10%; vLLM's
    default ``gpu_memory_utilization`` is 0.9). inf without KV; 0 when the weights do not fit.
    Single device, no tensor parallelism.
    """
    if not (0.0 <= reserve_fraction < 1.0):
        raise AnalysisError(f"reserve_fraction must be in [0, 1), got {reserve_fraction}.")
    _concurrency_array(1.0, context_tokens)
    free = hw.memory_bytes * (1.0 - reserve_fraction) - shape.weight_bytes
    per_seq = context_tokens * shape.kv_bytes_per_token
    if free <= 0:
        return 0.0
    return math.inf if per_seq == 0 else free / per_seq


@dataclass(frozen=True)
class RooflinePoint:
    """A measured decode throughput next to its roofline bound (both tokens/s)."""

    concurrency: float
    measured_tokens_per_s: float
    bound_tokens_per_s: float
    fraction_of_bound: float


def fraction_of_bound(
    shape: ModelShape,
    hw: Hardware,
    concurrency: object,
    context_tokens: float,
    measured_tokens_per_s: object,
) -> tuple[RooflinePoint, ...]:
    """``measured / bound`` at each concurrency (scalars or equal-length arrays).

    A fraction above 1 means the shape or hardware is wrong (or the tokens were miscounted).
    """
    c = np.atleast_1d(_concurrency_array(concurrency, context_tokens))
    measured = np.atleast_1d(np.asarray(measured_tokens_per_s, dtype=float))
    if measured.shape != c.shape:
        raise AnalysisError(f"{c.size} concurrencies but {measured.size} measured throughputs.")
    if not np.all(np.isfinite(measured)) or np.any(measured < 0):
        raise AnalysisError(f"measured_tokens_per_s must be finite and >= 0: {measured.tolist()}.")
    t_bound, _ = _step_time_bound(shape, hw, c, context_tokens)
    bound = c / t_bound
    return tuple(
        RooflinePoint(float(ci), float(m), float(b), float(m / b))
        for ci, m, b in zip(c, measured, bound, strict=True)
    )


@dataclass(frozen=True, eq=False)
class RooflineCurve:
    """A roofline-only *prediction* for hardware the user may not have: no measurement in it.

    Arrays share the order of ``concurrency``. ``fits_in_memory`` is False where weights plus KV
    cache exceed ``hw.memory_bytes`` on one device (see :func:`max_concurrency_by_memory`).
    """

    hardware: str
    context_tokens: float
    concurrency: np.ndarray
    step_time_bound_s: np.ndarray
    tokens_per_s_bound: np.ndarray
    compute_bound: np.ndarray
    fits_in_memory: np.ndarray
    compute_bound_concurrency: float
    is_prediction: bool = True


def roofline_curve(
    shape: ModelShape, hw: Hardware, concurrencies: object, context_tokens: float
) -> RooflineCurve:
    """Bound on step time and tokens/s at each concurrency, with the compute-bound crossing."""
    c = np.atleast_1d(_concurrency_array(concurrencies, context_tokens))
    t_bound, compute = _step_time_bound(shape, hw, c, context_tokens)
    cap = max_concurrency_by_memory(shape, hw, context_tokens, reserve_fraction=0.0)
    return RooflineCurve(
        hardware=hw.name,
        context_tokens=float(context_tokens),
        concurrency=c,
        step_time_bound_s=t_bound,
        tokens_per_s_bound=c / t_bound,
        compute_bound=compute,
        fits_in_memory=c <= cap,
        compute_bound_concurrency=compute_bound_concurrency(hw, shape, context_tokens),
    )
