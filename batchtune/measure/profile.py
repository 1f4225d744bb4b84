"""The profiling driver: measure generation throughput against concurrency, and training step time
against batch, on the user's hardware (docs/method.md §4); write ThroughputPoints; analyse them.

    run_profile(recipe, store)       sweep -> points appended to the store -> ProfileResult
    analyse_throughput(points, recipe)  the same ProfileResult from stored points alone
    roofline_only(recipe, "H100-SXM")   a bound for hardware the user does not have (no engine run)

For each mode (``fixed``: EOS ignored; ``eos``: long-tailed lengths) the concurrency grid is swept
ascending; each point is ``warmup`` untimed calls then ``repeats`` timed ones, reported as the
median (and half the max-min spread). The first OutOfMemory ends that mode's sweep and is stored as
a point with status ``oom``: the memory ceiling. The critical generation batch is the knee of
responses/s against concurrency (``analysis.system.throughput.find_knee``). Nothing here prints: progress
goes to an optional ``progress(done, total, description)`` callback.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchtune.analysis.system.hardware import (
    RooflinePrediction,
    known_hardware_for_device,
    resolve_hardware,
    roofline_only,
)
from batchtune.analysis.system.profile import ModeProfile, ProfileResult, analyse_throughput
from batchtune.backends.spec import GenRequest, ModelInfo, OutOfMemory, RunFailed
from batchtune.errors import BackendError
from batchtune.events import SweepProgress
from batchtune.measure import contention
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore
from batchtune.records.types import ThroughputPoint

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
        queued=max(r.queued for r in results),
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
    A contended profile is timed again (measure/profile_retime.py) and the least contended kept.

    Never raises for an OOM or a failed point (they are stored with their status); raises
    BatchtuneError for a backend that cannot start. Points measured before an unexpected error
    are still stored.
    """
    from batchtune.measure.profile_retime import Attempt, least_contended, retime_note, retries

    g = recipe.generation
    if recipe.hardware.name != "auto":  # a bad hardware name fails before the sweep, not after it
        resolve_hardware(recipe, "")
    from batchtune.backends import load

    backend_cls = load("generation", g.backend)
    concurrencies = sorted(set(g.concurrency))
    train_batches = sorted(set(g.train_batches))
    per_sweep = (g.warmup + g.repeats) * (len(g.modes) * len(concurrencies) + len(train_batches))
    prog = _Progress(total=per_sweep, callback=progress)
    base_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    start = time.perf_counter()
    prog.step(f"starting the {g.backend} backend", 0)
    backend = backend_cls(recipe)
    done: list[Attempt] = []
    current: list[ThroughputPoint] = []
    kept: Attempt | None = None
    try:
        info = backend.model_info()
        device = str(getattr(backend, "device_name", "") or recipe.hardware.device)

        def time_once(i: int) -> Attempt:
            nonlocal current, start
            profile_id = base_id if i == 0 else f"{base_id}-r{i}"
            if i:
                prog.total += per_sweep
                prog.step(f"re-timing a contended profile ({i + 1} of {retries(recipe) + 1} at most)", 0)
                start = time.perf_counter()
            store.write_model_info(profile_id, info)  # the analysis reads the shape from here, never a model
            common = {
                "backend": g.backend,
                "model": recipe.model.name,
                "hardware": device,
                "profile_id": profile_id,
                "cpu_cores": contention.cpu_count(),
            }
            current = []
            for mode in g.modes:
                current += _sweep_generation(backend, recipe, mode, concurrencies, common, prog)
            current += _sweep_training(backend, recipe, train_batches, common, prog)
            wall = time.perf_counter() - start
            result = analyse_throughput(current, recipe, profile_id=profile_id, model_info=info, wall_s=wall)
            done.append(Attempt(current, result))
            current = []
            return done[-1]

        kept, _ = least_contended(recipe, time_once)
    finally:
        try:
            backend.close()
        finally:
            order = [a for a in done if a is not kept] + ([kept] if kept is not None else [])
            store.append_throughput([p for a in order for p in a.points] + current)  # the kept one last
    return dataclasses.replace(kept.result, retimed=retime_note(recipe, kept, done))


def _failed_point(exc: RunFailed, **fields: Any) -> ThroughputPoint:
    status = "oom" if isinstance(exc, OutOfMemory) or exc.status == "oom" else "failed"
    return ThroughputPoint(status=status, message=exc.message, **fields)


@dataclass
class _Sweep:
    """Timed results per grid point, the other processes' load over them, and the first failure."""

    results: dict[int, list[Any]] = field(default_factory=dict)
    other_core_s: dict[int, float] = field(default_factory=dict)
    timed_s: dict[int, float] = field(default_factory=dict)
    failed: tuple[int, RunFailed] | None = None

    def other_cores(self, key: int) -> float:
        t = self.timed_s.get(key, 0.0)
        return self.other_core_s.get(key, math.nan) / t if t > 0 else math.nan


def _interleaved(
    keys: list[int], warmup: int, repeats: int, once: Callable[[int, int], Any], what: str, prog: _Progress
) -> _Sweep:
    """Measure every key ``warmup`` + ``repeats`` times, the repeats interleaved across the keys.

    Pass 0 climbs the grid (warm-up calls, then the first timed call at each key): the first failure
    there is the ceiling and ends the sweep. The other repeats sweep the measured keys down, then up,
    one timed call per key per pass, so a load that comes or goes during the sweep spreads over every
    point instead of bending the curve (a knee) between neighbours. A failure in a later pass ends
    the sweep at that key too. ``once(key, call_index)`` runs one call; its result is kept.
    """
    sweep = _Sweep()
    budget, used = (warmup + repeats) * len(keys), 0

    def step(description: str) -> None:
        nonlocal used
        used += 1
        prog.step(description)

    def timed(key: int, k: int) -> None:
        before = contention.read()
        result = once(key, k)
        cores, dt = contention.other_cores(before), time.perf_counter() - before.wall
        sweep.results.setdefault(key, []).append(result)
        if math.isfinite(cores):
            sweep.other_core_s[key] = sweep.other_core_s.get(key, 0.0) + cores * dt
            sweep.timed_s[key] = sweep.timed_s.get(key, 0.0) + dt

    def stop(key: int, exc: RunFailed) -> _Sweep:
        sweep.failed = (key, exc)
        for above in [m for m in sweep.results if m >= key]:  # the ceiling: nothing above it counts
            del sweep.results[above]
        prog.step(f"{what}: stopped at {key} ({exc.status})", budget - used)
        return sweep

    measured: list[int] = []
    for key in keys:
        try:
            for k in range(warmup):
                once(key, k)
                step(f"{what} {key} (warm-up)")
            timed(key, warmup)
        except RunFailed as exc:
            return stop(key, exc)
        step(f"{what} {key} (repeat 1/{repeats})")
        measured.append(key)
    for r in range(1, repeats):
        for key in measured[::-1] if r % 2 else measured:
            try:
                timed(key, warmup + r)
            except RunFailed as exc:
                return stop(key, exc)
            step(f"{what} {key} (repeat {r + 1}/{repeats})")
    return sweep


def _sweep_generation(
    backend: Any, recipe: Recipe, mode: str, concurrencies: list[int], common: dict[str, Any], prog: _Progress
) -> list[ThroughputPoint]:
    g = recipe.generation

    def fields(c: int) -> dict[str, Any]:
        return dict(
            common,
            kind="generation",
            mode=mode,
            concurrency=c,
            prompt_tokens=g.prompt_tokens,
            max_new_tokens=g.max_new_tokens,
        )

    def once(c: int, k: int) -> Any:
        group = group_size_for(c, recipe.candidates.group_size)
        req = GenRequest(c, group, g.prompt_tokens, g.max_new_tokens, mode, seed=g.seed * 100_003 + k)
        return backend.generate(req)

    sweep = _interleaved(concurrencies, g.warmup, g.repeats, once, f"{mode}: concurrency", prog)
    points = [
        _summarise(res, other_cores=sweep.other_cores(c), **fields(c))
        for c, res in sorted(sweep.results.items())
    ]
    if sweep.failed is not None:
        c, exc = sweep.failed
        points.append(_failed_point(exc, **fields(c)))
    return points


def _sweep_training(
    backend: Any, recipe: Recipe, batches: list[int], common: dict[str, Any], prog: _Progress
) -> list[ThroughputPoint]:
    g = recipe.generation
    seq_tokens = g.prompt_tokens + g.max_new_tokens

    def fields(n: int) -> dict[str, Any]:
        return dict(
            common,
            kind="training",
            mode="train",
            concurrency=n,
            prompt_tokens=g.prompt_tokens,
            max_new_tokens=g.max_new_tokens,
        )

    sweep = _interleaved(
        batches, g.warmup, g.repeats, lambda n, k: backend.train_step_s(n, seq_tokens), "train: batch", prog
    )
    points = []
    for n, times in sorted(sweep.results.items()):
        median = statistics.median(times)
        points.append(
            ThroughputPoint(
                responses_per_s=n / median,
                output_tokens_per_s=n * seq_tokens / median,  # tokens trained per second
                step_latency_s=median,
                step_latency_spread_s=(max(times) - min(times)) / 2.0,
                repeats=len(times),
                other_cores=sweep.other_cores(n),
                **fields(n),
            )
        )
    if sweep.failed is not None:
        n, exc = sweep.failed
        points.append(_failed_point(exc, **fields(n)))
    return points
