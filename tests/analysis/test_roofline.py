"""Roofline bounds for decoding, checked against hand-computed cases (docs/method.md §4)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchtune.analysis.system.roofline import (
    KNOWN_HARDWARE,
    Hardware,
    ModelShape,
    compute_bound_concurrency,
    decode_step_time_bound_s,
    decode_tokens_per_s_bound,
    fraction_of_bound,
    get_hardware,
    kv_bytes_per_token,
    max_concurrency_by_memory,
    roofline_curve,
)
from batchtune.errors import AnalysisError, InputError

H200 = KNOWN_HARDWARE["H200"]
# Qwen2.5-0.5B-like: 24 layers, 2 KV heads of dim 64, bf16 -> 2*24*2*64*2 = 12288 B per token
QWEN_05B = ModelShape.dense(0.5e9, kv_bytes_per_token=kv_bytes_per_token(24, 2, 64))


def test_kv_bytes_per_token():
    assert kv_bytes_per_token(24, 2, 64) == 12288.0
    assert kv_bytes_per_token(24, 2, 64, bytes_per_elem=1) == 6144.0


def test_hand_computed_half_billion_dense_on_h200():
    # weights: 0.5e9 params * 2 B = 1.0e9 B
    # KV: 64 seqs * 1024 tokens * 12288 B = 805,306,368 B
    # memory time: 1,805,306,368 B / 4.8e12 B/s = 3.76105e-4 s
    # compute time: 2 * 0.5e9 * 64 / 989e12 = 6.4712e-5 s  -> memory-bound
    # tokens/s bound: 64 / 3.76105e-4 = 170,165 tok/s
    t = decode_step_time_bound_s(QWEN_05B, H200, 64, 1024)
    assert t == pytest.approx(1_805_306_368 / 4.8e12, rel=1e-12)
    assert t == pytest.approx(3.76105e-4, rel=1e-5)
    assert decode_tokens_per_s_bound(QWEN_05B, H200, 64, 1024) == pytest.approx(170_165, rel=1e-4)


def test_compute_term_wins_at_high_concurrency_without_kv():
    shape = ModelShape.dense(0.5e9)
    # at c = 4096: compute 2*0.5e9*4096/989e12 = 4.1416e-3 s > memory 1e9/4.8e12 = 2.083e-4 s
    assert decode_step_time_bound_s(shape, H200, 4096, 0) == pytest.approx(2 * 0.5e9 * 4096 / 989e12)
    # the throughput bound then saturates at peak / (2 N_active)
    assert decode_tokens_per_s_bound(shape, H200, 1e6, 0) == pytest.approx(989e12 / 1e9)


def test_compute_bound_concurrency_method_figures():
    dense = ModelShape.dense(7e9)
    assert round(compute_bound_concurrency(get_hardware("H200"), dense)) == 206
    assert round(compute_bound_concurrency(get_hardware("H100-SXM"), dense)) == 295
    moe = ModelShape(n_params=128e9, n_active_params=8e9)  # 128 experts, 8 active
    ratio = compute_bound_concurrency(H200, moe) / compute_bound_concurrency(H200, dense)
    assert ratio == pytest.approx(16.0)


def test_compute_bound_concurrency_is_the_crossing_point():
    shape = ModelShape(30e9, 3e9)
    c_star = compute_bound_concurrency(H200, shape)
    memory_s = shape.weight_bytes / H200.hbm_bytes_per_s
    compute_s = 2 * shape.n_active_params * c_star / H200.peak_flops
    assert compute_s == pytest.approx(memory_s)
    # fp32 weights take twice as long to read: the crossing doubles
    fp32 = ModelShape(30e9, 3e9, bytes_per_param=4)
    assert compute_bound_concurrency(H200, fp32) == pytest.approx(2 * c_star)


def test_compute_bound_concurrency_with_kv():
    # KV reads grow with concurrency, so the crossing moves out, to inf when they dominate
    c0 = compute_bound_concurrency(H200, QWEN_05B)
    c1 = compute_bound_concurrency(H200, QWEN_05B, context_tokens=16)
    assert c1 > c0
    assert math.isinf(compute_bound_concurrency(H200, QWEN_05B, context_tokens=1024))


def test_bound_is_monotone_in_concurrency():
    c = 2.0 ** np.arange(0, 14)
    curve = roofline_curve(ModelShape.dense(7e9), H200, c, context_tokens=0)
    assert np.all(np.diff(curve.tokens_per_s_bound) >= 0)
    assert np.all(np.diff(curve.step_time_bound_s) >= 0)
    assert curve.is_prediction
    assert np.array_equal(curve.compute_bound, c >= curve.compute_bound_concurrency)


def test_roofline_curve_flags_memory_overflow():
    shape = ModelShape.dense(7e9, kv_bytes_per_token=kv_bytes_per_token(28, 4, 128))
    cap = max_concurrency_by_memory(shape, H200, 4096, reserve_fraction=0.0)
    # (141e9 - 14e9) / (4096 * 57344) = 540.7 sequences
    assert cap == pytest.approx((141e9 - 14e9) / (4096 * 57344))
    curve = roofline_curve(shape, H200, [256, 512, 1024], context_tokens=4096)
    assert curve.fits_in_memory.tolist() == [True, True, False]
    assert curve.hardware == "H200"


def test_max_concurrency_by_memory_edges():
    assert math.isinf(max_concurrency_by_memory(ModelShape.dense(1e9), H200, 1024))
    too_big = ModelShape.dense(100e9)  # 200 GB of bf16 weights
    assert max_concurrency_by_memory(too_big, H200, 1024) == 0.0
    with pytest.raises(AnalysisError):
        max_concurrency_by_memory(QWEN_05B, H200, 1024, reserve_fraction=1.0)


def test_fraction_of_bound():
    bound = decode_tokens_per_s_bound(QWEN_05B, H200, 64, 1024)
    points = fraction_of_bound(QWEN_05B, H200, [64, 64], 1024, [bound / 2, bound])
    assert [p.fraction_of_bound for p in points] == pytest.approx([0.5, 1.0])
    assert points[0].bound_tokens_per_s == pytest.approx(bound)
    (single,) = fraction_of_bound(QWEN_05B, H200, 64, 1024, bound / 4)
    assert single.fraction_of_bound == pytest.approx(0.25)
    with pytest.raises(AnalysisError):
        fraction_of_bound(QWEN_05B, H200, [64, 128], 1024, [1.0])


def test_known_hardware_table():
    expected = {
        "H200": (989e12, 4.8e12, 141e9),
        "H100-SXM": (989e12, 3.35e12, 80e9),
        "H100-PCIe": (756e12, 2.0e12, 80e9),
        "A100-80GB": (312e12, 2.039e12, 80e9),
        "A100-40GB": (312e12, 1.555e12, 40e9),
        "L40S": (362e12, 0.864e12, 48e9),
        "B200": (2.25e15, 8e12, 192e9),
    }
    for name, (flops, bw, mem) in expected.items():
        hw = KNOWN_HARDWARE[name]
        assert (hw.name, hw.peak_flops, hw.hbm_bytes_per_s, hw.memory_bytes) == (
            name,
            flops,
            bw,
            mem,
        )


def test_get_hardware_lookup_and_overrides():
    assert get_hardware("h100-sxm") == KNOWN_HARDWARE["H100-SXM"]
    assert get_hardware("H100_SXM").name == "H100-SXM"
    capped = get_hardware("H200", peak_flops=700e12)
    assert capped.peak_flops == 700e12 and capped.hbm_bytes_per_s == 4.8e12
    custom = get_hardware("MI300X", peak_flops=1307e12, hbm_bytes_per_s=5.3e12, memory_bytes=192e9)
    assert custom == Hardware("MI300X", 1307e12, 5.3e12, 192e9)


def test_get_hardware_errors():
    with pytest.raises(InputError, match="H200"):  # an unknown name is an input error; lists the known
        get_hardware("TPU-v9")
    with pytest.raises(AnalysisError, match="unknown hardware field"):
        get_hardware("H200", flops=1.0)
    with pytest.raises(AnalysisError):
        get_hardware("H200", peak_flops=-1.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_params=0.0, n_active_params=0.0),
        dict(n_params=1e9, n_active_params=2e9),
        dict(n_params=float("nan"), n_active_params=1e9),
        dict(n_params=1e9, n_active_params=1e9, kv_bytes_per_token=-1.0),
    ],
)
def test_model_shape_rejects_bad_values(kwargs):
    with pytest.raises(AnalysisError):
        ModelShape(**kwargs)


def test_bounds_reject_bad_concurrency_and_context():
    with pytest.raises(AnalysisError):
        decode_step_time_bound_s(QWEN_05B, H200, 0, 1024)
    with pytest.raises(AnalysisError):
        decode_step_time_bound_s(QWEN_05B, H200, 64, -1)
