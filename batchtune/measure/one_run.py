"""One probe run: a candidate at one seed, trained into the results store until its stop rule
(measure/stop_rule.py) ends it, then finished with its run record.

``execute_run`` runs in the caller's process, in a pool worker, a Ray task or a Ray Job; its
arguments travel by position (as JSON for a job), so its signature is the contract of every executor.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchtune import backends
from batchtune.backends.spec import Candidate, RunFailed, RunSpec
from batchtune.errors import BackendError, MetricMissingError
from batchtune.measure.guards import check_metric_present
from batchtune.measure.plan import run_id, run_record
from batchtune.measure.stop_rule import RunCurve, StopPolicy, budget_reason, stop_reason
from batchtune.recipe.schema import Recipe
from batchtune.records.paths import contained
from batchtune.records.store import ResultsStore
from batchtune.records.types import RunRecord, StepRecord

Emit = Callable[..., None]


@dataclass(frozen=True)
class _Outcome:
    status: str
    reason: str
    failed_start: bool  # the trainer failed before its first step (RunFailed with started=False)
    curve: RunCurve


def execute_run(
    recipe: Recipe,
    results_dir: str,
    candidate: Candidate,
    seed: int,
    base_lr: float,
    reference_batch: int,
    policy: StopPolicy,
    rid: str | None = None,
    spec_extra: dict[str, Any] | None = None,
    events: Any = None,
    *,
    parallel_runs: int = 1,
) -> RunRecord | None:
    """Run one candidate at one seed into the store. Returns None if it was finished or taken.

    ``events`` is a queue-like object with ``put`` (or a callable) that receives progress dicts.
    Branched probes and schedule runs pass their own ``rid`` and ``spec_extra`` (RunSpec's
    resume_from / save_at_samples / checkpoint_dir). ``parallel_runs`` (runs sharing this machine
    with it, itself included) is stored with the record, so its step times can be read as
    contended or not.
    """
    store = ResultsStore(results_dir)
    rid = rid or run_id(candidate, seed)
    emit = _emitter(events, rid)
    with store.claim(rid) as writer:
        if writer is None:
            return None
        spec = RunSpec(
            run_id=rid,
            candidate=candidate,
            seed=seed,
            recipe=recipe,
            run_dir=store.run_dir(rid),
            base_lr=base_lr,
            reference_batch=reference_batch,
            **_spec_extra(store, spec_extra),
        )
        backend = backends.load("training", recipe.backend.training)()
        emit("start", label=candidate.label, seed=seed)
        t0 = time.perf_counter()
        out = _train(backend.train(spec), writer.append, policy, emit, recipe.sample_unit)
        last = out.curve.last
        record = run_record(
            candidate,
            seed,
            base_lr,
            reference_batch,
            out.status,
            out.reason,
            rid=rid,
            steps=last.step if last else 0,
            samples=last.samples if last else 0,
            tokens=last.tokens if last else 0,
            wall_s=time.perf_counter() - t0,
            backend=recipe.backend.training,
            parallel_runs=parallel_runs,
            cpu_cores=os.cpu_count() or 0,
            failed_start=out.failed_start and last is None,
            **out.curve.totals,  # gen_s / train_s / other_s
        )
        writer.finish(record)
        emit("end", status=out.status, reason=out.reason)
        return record


def _spec_extra(store: ResultsStore, spec_extra: dict[str, Any] | None) -> dict[str, Any]:
    """RunSpec's extra fields, with paths and tuples that travelled as JSON strings and lists read
    back; a checkpoint path never leads out of the store through a link."""
    extra = dict(spec_extra or {})
    for key in ("resume_from", "checkpoint_dir"):
        if extra.get(key) is not None:
            extra[key] = contained(store.root, Path(extra[key]))
    if "save_at_samples" in extra:
        extra["save_at_samples"] = tuple(int(v) for v in extra["save_at_samples"])
    return extra


def _emitter(events: Any, rid: str) -> Emit:
    """A function sending progress dicts to ``events`` (a callable, a queue, or None: nowhere)."""

    def emit(kind: str, **info: Any) -> None:
        if events is None:
            return
        payload = {"kind": kind, "run_id": rid, **info}
        if callable(events):
            events(kind, payload)
        else:
            events.put(payload)

    return emit


def _train(
    stream: Generator[StepRecord, None, None],
    append: Callable[[StepRecord], None],
    policy: StopPolicy,
    emit: Emit,
    unit: str,
) -> _Outcome:
    """Stream the trainer's steps into the store until the stop rule ends the run. A failure of
    the run is data (its status); one of the recipe or the environment (every run would fail) is
    raised."""
    curve = RunCurve()
    status, reason = "budget_exhausted", budget_reason(policy, unit)
    failed_start = False
    logged: set[str] = set()  # metric names seen until the target metric shows up
    try:
        for step in stream:
            append(step)
            if policy.metric not in logged:
                logged.update(step.metrics)  # raises below if the target metric is missing
                check_metric_present(policy.metric, step.metrics, logged)
            curve.add(step, policy)
            emit("step", samples=step.samples, max_samples=policy.max_samples)
            verdict = stop_reason(policy, curve, step, unit)
            if verdict is not None:
                status, reason = verdict
                break
    except (MetricMissingError, BackendError):
        raise  # the recipe or the environment is wrong for every run (no GPU, a module): not data
    except RunFailed as exc:
        status, reason, failed_start = exc.status, exc.message, not exc.started
    except MemoryError:
        status, reason = "oom", "host out of memory"
    except Exception as exc:  # a backend bug or a user's reward function: data, not a crash
        status, reason = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        stream.close()
    return _Outcome(status, reason, failed_start, curve)
