"""The profiling driver: measure generation throughput against concurrency, and training step time
against batch, on the user's hardware (docs/method.md §4); write ThroughputPoints; analyse them.

    run_profile(recipe, store)       sweep -> points appended to the store -> ProfileResult
    analyse_throughput(points, recipe)  the same ProfileResult from stored points alone
    roofline_only(recipe, "H100-SXM")   a bound for hardware the user does not have (no engine run)

For each mode (``fixed``: EOS ignored; ``eos``: long-tailed lengths) the concurrency grid is swept
ascending; each point is ``warmup`` untimed calls then ``repeats`` timed ones, reported as the
median (and half the max-min spread). The first OutOfMemory ends that mode's sweep and is stored as
a point with status ``oom``: the memory ceiling. The critical generation batch is the knee of
responses/s against concurrency (``analysis.throughput.find_knee``). Nothing here prints: progress
goes to an optional ``progress(done, total, description)`` callback.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchtune.analysis.profile import (
    ModeProfile,
    ProfileResult,
    RooflinePrediction,
    analyse_throughput,
    known_hardware_for_device,
    resolve_hardware,
    roofline_only,
)
from batchtune.backends.spec import GenRequest, ModelInfo, OutOfMemory, RunFailed
from batchtune.errors import BackendError
from batchtune.events import SweepProgress
from batchtune.recipe.schema import Recipe
from batchtune.records import ResultsStore, ThroughputPoint

__all__ = [
    "ModeProfile",
    "ProfileResult",
    "ProgressFn",
    "RooflinePrediction",
    "analyse_throughput",
    "known_hardware_for_device",
    "model_info_for_recipe",
    "predict_roofline",
    "roofline_only",
    "run_profile",
]

ProgressFn = SweepProgress


def model_info_for_recipe(recipe: Recipe, device: str = "cuda") -> ModelInfo:
    """The model's shape without loading weights: the tiny model's config, or ``config.json`` of a
    local model directory. dtype ``auto`` is float32 on CPU and the config's (else bf16) on a GPU."""
    from batchtune.backends.timing import DTYPE_BYTES, model_info_from_config

    m = recipe.model
    on_cpu = device in ("", "cpu")
    if m.name == "tiny-llama":
        from batchtune.backends.models import CharTokenizer, tiny_llama_config

        cfg = tiny_llama_config(m, CharTokenizer().vocab_size).to_dict()
        dtype = m.dtype if m.dtype != "auto" else ("float32" if on_cpu else "bfloat16")
        return model_info_from_config(cfg, m.name, DTYPE_BYTES[dtype])
    path = Path(m.name) / "config.json"
    if not path.is_file():
        raise BackendError(
            f"no config.json for model {m.name!r}: give a local model directory to compute its shape"
        )
    cfg = json.loads(path.read_text())
    dtype = m.dtype
    if dtype == "auto":
        dtype = "float32" if on_cpu else str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return model_info_from_config(cfg, m.name, DTYPE_BYTES.get(dtype, 2.0))


def predict_roofline(recipe: Recipe, hardware: str | None = None) -> RooflinePrediction:
    """The roofline prediction for the recipe's model (its shape from the config, no weights)."""
    return roofline_only(recipe, hardware, model_info=model_info_for_recipe(recipe, "cuda"))


# ---- measuring ----------------------------------------------------------------------------------


def group_size_for(concurrency: int, group_size: int) -> int:
    """Responses per prompt at this concurrency: G when it divides, else gcd (1..G)."""
    return group_size if concurrency % group_size == 0 else math.gcd(concurrency, group_size)


def _summarise(results: list[Any], **fields: Any) -> ThroughputPoint:
    elapsed = [r.elapsed_s for r in results]
    responses = sum(r.responses for r in results)
    tokens = sum(r.output_tokens for r in results)
    return ThroughputPoint(
        responses_per_s=statistics.median(r.responses / r.elapsed_s for r in results),
        output_tokens_per_s=statistics.median(r.output_tokens / r.elapsed_s for r in results),
        step_latency_s=statistics.median(elapsed),
        step_latency_spread_s=(max(elapsed) - min(elapsed)) / 2.0,
        peak_mem_bytes=max(r.peak_mem_bytes for r in results),
        preemptions=sum(r.preemptions for r in results),
        repeats=len(results),
        mean_output_tokens=tokens / responses if responses else 0.0,
        **fields,
    )


@dataclass
class _Progress:
    total: int
    callback: ProgressFn | None
    done: int = 0
    skipped: list[int] = field(default_factory=list)

    def step(self, description: str, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        if self.callback is not None:
            self.callback(self.done, self.total, description)


def run_profile(recipe: Recipe, store: ResultsStore, progress: ProgressFn | None = None) -> ProfileResult:
    """Sweep generation concurrency per mode and training batch; store the points; analyse them.

    Never raises for an OOM or a failed point (they are stored with their status); raises
    BatchtuneError for a backend that cannot start. Points measured before an unexpected error
    are still stored.
    """
    g = recipe.generation
    if recipe.hardware.name != "auto":  # a bad hardware name fails before the sweep, not after it
        resolve_hardware(recipe, "")
    from batchtune.backends import load

    backend_cls = load("generation", g.backend)
    concurrencies = sorted(set(g.concurrency))
    train_batches = sorted(set(g.train_batches))
    calls = g.warmup + g.repeats
    prog = _Progress(
        total=calls * (len(g.modes) * len(concurrencies) + len(train_batches)), callback=progress
    )
    profile_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    start = time.perf_counter()
    prog.step(f"starting the {g.backend} backend", 0)
    backend = backend_cls(recipe)
    points: list[ThroughputPoint] = []
    info: ModelInfo | None = None
    try:
        info = backend.model_info()
        store.write_model_info(profile_id, info)  # the analysis reads the shape from here, never a model
        device = str(getattr(backend, "device_name", "") or recipe.hardware.device)
        common = {
            "backend": g.backend,
            "model": recipe.model.name,
            "hardware": device,
            "profile_id": profile_id,
        }
        for mode in g.modes:
            for i, c in enumerate(concurrencies):
                point = _measure_generation(backend, recipe, mode, c, common, prog)
                points.append(point)
                if point.status != "ok":
                    prog.step(f"{mode}: stopped at concurrency {c}", calls * (len(concurrencies) - i - 1))
                    break
        seq_tokens = g.prompt_tokens + g.max_new_tokens
        for i, n in enumerate(train_batches):
            point = _measure_training(backend, recipe, n, seq_tokens, common, prog)
            points.append(point)
            if point.status != "ok":
                prog.step(f"train: stopped at batch {n}", calls * (len(train_batches) - i - 1))
                break
    finally:
        try:
            backend.close()
        finally:
            store.append_throughput(points)
    return analyse_throughput(
        points, recipe, profile_id=profile_id, model_info=info, wall_s=time.perf_counter() - start
    )


def _failed_point(exc: RunFailed, **fields: Any) -> ThroughputPoint:
    status = "oom" if isinstance(exc, OutOfMemory) or exc.status == "oom" else "failed"
    return ThroughputPoint(status=status, message=exc.message, **fields)


def _measure_generation(
    backend: Any, recipe: Recipe, mode: str, c: int, common: dict[str, Any], prog: _Progress
) -> ThroughputPoint:
    g = recipe.generation
    fields = dict(
        common,
        kind="generation",
        mode=mode,
        concurrency=c,
        prompt_tokens=g.prompt_tokens,
        max_new_tokens=g.max_new_tokens,
    )
    group = group_size_for(c, recipe.candidates.group_size)
    results = []
    try:
        for k in range(g.warmup + g.repeats):
            req = GenRequest(c, group, g.prompt_tokens, g.max_new_tokens, mode, seed=g.seed * 100_003 + k)
            res = backend.generate(req)
            warm = k < g.warmup
            if not warm:
                results.append(res)
            prog.step(
                f"{mode}: concurrency {c} ({'warm-up' if warm else f'repeat {k - g.warmup + 1}/{g.repeats}'})"
            )
    except RunFailed as exc:
        prog.step(f"{mode}: concurrency {c} {exc.status}", 0)
        return _failed_point(exc, **fields)
    return _summarise(results, **fields)


def _measure_training(
    backend: Any, recipe: Recipe, n: int, seq_tokens: int, common: dict[str, Any], prog: _Progress
) -> ThroughputPoint:
    g = recipe.generation
    fields = dict(
        common,
        kind="training",
        mode="train",
        concurrency=n,
        prompt_tokens=g.prompt_tokens,
        max_new_tokens=g.max_new_tokens,
    )
    times = []
    try:
        for k in range(g.warmup + g.repeats):
            t = backend.train_step_s(n, seq_tokens)
            if k >= g.warmup:
                times.append(t)
            prog.step(f"train: batch {n}")
    except RunFailed as exc:
        return _failed_point(exc, **fields)
    median = statistics.median(times)
    return ThroughputPoint(
        responses_per_s=n / median,
        output_tokens_per_s=n * seq_tokens / median,  # tokens trained per second
        step_latency_s=median,
        step_latency_spread_s=(max(times) - min(times)) / 2.0,
        repeats=len(times),
        **fields,
    )
