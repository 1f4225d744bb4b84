"""Helpers the generation backends share: timing with device sync, peak memory, OOM detection,
training-step timing, and a model's shape from its config (parameter count, KV-cache geometry).

torch is imported inside the functions that need it, so the shape helpers below can be used
(by ``profile.roofline_only``) without importing torch.
"""

from __future__ import annotations

import contextlib
import math
import resource
import sys
import time
from collections.abc import Iterator
from typing import Any

from batchtune.backends.spec import ModelInfo, OutOfMemory
from batchtune.errors import BackendError

# ---- timing -------------------------------------------------------------------------------------


def sync(device: Any) -> None:
    """Wait for queued device work (CUDA kernels run asynchronously); a no-op on CPU."""
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        torch.cuda.synchronize(device)


@contextlib.contextmanager
def timed(device: Any) -> Iterator[dict[str, float]]:
    """``with timed(dev) as t: ...`` then ``t["elapsed_s"]``: wall time, device synced at both ends."""
    out: dict[str, float] = {}
    sync(device)
    start = time.perf_counter()
    try:
        yield out
    finally:
        sync(device)
        out["elapsed_s"] = time.perf_counter() - start


# ---- memory -------------------------------------------------------------------------------------


def reset_peak_memory(device: Any) -> None:
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: Any) -> int:
    """Peak memory in bytes.

    CUDA: bytes allocated by torch's caching allocator since the last ``reset_peak_memory``
    (tensors only; the allocator's reserve and the CUDA context are not included). CPU: the
    process's peak resident set size since it started (``getrusage``), which never goes down, so on
    CPU it is an upper bound for the call, not the call's own peak.
    """
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB, macOS bytes


def device_memory_in_use_bytes(device: Any) -> int:
    """Memory an engine that runs its model in a child process (vLLM) holds, which torch's
    allocator statistics in this process never see.

    CUDA: bytes in use on the device by every process (``total - free``). CPU: the resident set
    size of this process and all its descendants (``process_tree_rss_bytes``).
    """
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info(device)
        return int(total - free)
    return process_tree_rss_bytes()


def process_tree_rss_bytes(pid: int | None = None) -> int:
    """Resident bytes of process ``pid`` (default: this one) and all its descendants, now.

    A sum of RSS: pages shared between the processes (the torch libraries each one maps, for
    instance) are counted once per process, so it is an upper bound on the physical memory the
    tree holds. psutil where installed, else ``/proc`` (Linux); a process that exits meanwhile is
    skipped.
    """
    import os

    root = os.getpid() if pid is None else pid
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return _proc_tree_rss_bytes(root)
    try:
        procs = [psutil.Process(root)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += int(proc.memory_info().rss)
    return total


def _proc_tree_rss_bytes(root: int) -> int:
    """``process_tree_rss_bytes`` from ``/proc/<pid>/stat`` (parent ids) and ``statm`` (pages)."""
    import os
    from pathlib import Path

    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])  # fields after "(comm)": state ppid
            children.setdefault(ppid, []).append(int(entry.name))
    page = os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
    return total


def is_oom(exc: BaseException) -> bool:
    """True for a CUDA out-of-memory error (torch >= 2.1 raises torch.OutOfMemoryError)."""
    import torch

    oom_types = tuple(
        t
        for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
        if t
    )
    if oom_types and isinstance(exc, oom_types):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def release_memory(device: Any) -> None:
    import gc

    gc.collect()
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        torch.cuda.empty_cache()


def device_name(device: Any) -> str:
    """``"cpu"`` or the CUDA device's marketing name (e.g. ``"NVIDIA H200"``)."""
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        return str(torch.cuda.get_device_name(device))
    return "cpu"


# ---- training step ------------------------------------------------------------------------------


def time_train_step(
    model: Any,
    optimizer: Any,
    batch: int,
    seq_tokens: int,
    vocab_size: int,
    device: Any,
    micro_batch: int,
    seed: int = 0,
) -> tuple[float, int]:
    """Seconds for one optimiser step on ``batch`` random sequences of ``seq_tokens`` tokens.

    Forward + backward (causal-LM loss, labels = inputs) over micro-batches of ``micro_batch``
    sequences with gradient accumulation, then ``optimizer.step()``; synced before and after.
    On CUDA out-of-memory the micro-batch is halved and the step retried; OutOfMemory when even one
    sequence does not fit. Returns ``(seconds, micro_batch_used)``.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch, seq_tokens), generator=gen).to(device)
    micro = max(1, min(micro_batch, batch))
    was_training = model.training
    model.train()
    try:
        while True:
            try:
                with timed(device) as t:
                    optimizer.zero_grad(set_to_none=True)
                    for chunk in ids.split(micro):
                        loss = model(input_ids=chunk, labels=chunk).loss * (chunk.shape[0] / batch)
                        loss.backward()
                    optimizer.step()
                return t["elapsed_s"], micro
            except Exception as exc:  # noqa: BLE001 - only OOM is retried, the rest re-raised
                if not is_oom(exc):
                    raise
                optimizer.zero_grad(set_to_none=True)
                release_memory(device)
                if micro == 1:
                    why = str(exc).splitlines()[0]
                    raise OutOfMemory(f"one sequence of {seq_tokens} tokens does not fit: {why}") from None
                micro = max(1, micro // 2)
    finally:
        model.train(was_training)


# ---- model shape from a config ------------------------------------------------------------------


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def model_info_from_config(cfg: dict[str, Any], name: str, bytes_per_param: float) -> ModelInfo:
    """Parameter counts and KV geometry of a decoder-only transformer, from its HF config dict.

    Covers Llama/Qwen2/Mistral-style dense models (RMSNorm, gated MLP, GQA) and the common MoE
    fields (``num_experts``/``num_local_experts``, ``num_experts_per_tok``,
    ``moe_intermediate_size``; every layer an MoE layer, no shared experts). Per layer:
    ``q: h*H*d, k/v: h*K*d each, o: H*d*h`` (+ q/k/v biases for Qwen2, + all four with
    ``attention_bias``), MLP ``3*h*I`` per expert (+ router ``h*E``), two norms ``2h``; plus the
    embedding ``V*h``, the LM head ``V*h`` unless tied, and the final norm ``h``. Active parameters
    count ``k`` of ``E`` experts. ``n_params`` is the total; the roofline reads all of them.
    """
    try:
        h = int(cfg["hidden_size"])
        n_layers = int(_get(cfg, "num_hidden_layers", "n_layer", "num_layers"))
        n_heads = int(_get(cfg, "num_attention_heads", "n_head"))
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BackendError(
            f"config of {name!r} lacks {exc} (need hidden_size, num_hidden_layers, "
            "num_attention_heads, vocab_size): only decoder-only HF configs are supported"
        ) from None
    n_kv = int(_get(cfg, "num_key_value_heads", default=n_heads))
    head_dim = int(_get(cfg, "head_dim", default=h // n_heads))
    inter = int(_get(cfg, "intermediate_size", default=4 * h))
    n_experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0))
    top_k = int(_get(cfg, "num_experts_per_tok", default=0))
    moe_inter = int(_get(cfg, "moe_intermediate_size", default=inter))
    tied = bool(cfg.get("tie_word_embeddings", True))

    qkv_bias = cfg.get("model_type") in ("qwen2", "qwen2_moe") or bool(cfg.get("attention_bias", False))
    o_bias = bool(cfg.get("attention_bias", False))
    attn = h * n_heads * head_dim + 2 * h * n_kv * head_dim + n_heads * head_dim * h
    if qkv_bias:
        attn += n_heads * head_dim + 2 * n_kv * head_dim
    if o_bias:
        attn += h
    mlp_bias = 2 * inter + h if cfg.get("mlp_bias") else 0
    if n_experts > 0:
        expert = 3 * h * moe_inter
        mlp_total = n_experts * expert + h * n_experts
        mlp_active = max(top_k, 1) * expert + h * n_experts
    else:
        mlp_total = mlp_active = 3 * h * inter + mlp_bias
    per_layer_common = attn + 2 * h
    embed = vocab * h * (1 if tied else 2) + h
    n_params = embed + n_layers * (per_layer_common + mlp_total)
    n_active = embed + n_layers * (per_layer_common + mlp_active)
    if not (math.isfinite(n_params) and n_params > 0):
        raise BackendError(f"config of {name!r} gives a non-positive parameter count")
    return ModelInfo(
        name=name,
        n_params=float(n_params),
        n_active_params=float(n_active),
        bytes_per_param=float(bytes_per_param),
        n_layers=n_layers,
        n_kv_heads=n_kv,
        head_dim=head_dim,
    )


DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
