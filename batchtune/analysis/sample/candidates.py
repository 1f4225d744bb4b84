"""From run records to candidates: each candidate's samples-to-target over its seeds, its failures
and its measured step times (docs/method.md §3.1). The verdicts come later (``assess.py``).

Pure: takes records (plain dataclasses) and returns frozen results; no engine import.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from batchtune.analysis.sample.curves import TargetCrossing, samples_to_target
from batchtune.analysis.sample.efficiency import CandidateEfficiency, RunData
from batchtune.analysis.sample.evals import eval_cost
from batchtune.analysis.sample.seeds import estimate_over_seeds
from batchtune.errors import AnalysisError, MetricMissingError, RunsFailed
from batchtune.records.types import FAILED_STATUSES, RunRecord


def _family(label: str, record: RunRecord, main_g: int) -> str:
    if label.endswith("-fixedlr") or record.lr_rule == "none":
        return "fixed_lr"
    if re.search(r"-k\d+u\d+$", label):
        return "offpolicy"
    return "main" if record.group_size == main_g else "group_sweep"


_NOT_DATA = tuple(s for s in FAILED_STATUSES if s != "diverged")  # failures that say nothing of R


def _median(values: Sequence[float]) -> float:
    return float(np.median(values)) if len(values) else 0.0


def _crossing(run: RunData, metric: str, target: float, higher: bool, ema_alpha: float) -> TargetCrossing:
    samples, values = run.curve(metric)
    if samples.size == 0 or run.record.status == "diverged":
        return TargetCrossing(samples_to_target=None, censored=True, max_samples=float(run.record.samples))
    crossing = samples_to_target(samples, values, target, higher_is_better=higher, ema_alpha=ema_alpha)
    # a run stopped by the probe may have consumed more than its last metric point: censor there
    if crossing.censored and run.record.samples > crossing.max_samples:
        return TargetCrossing(None, True, float(run.record.samples))
    return crossing


def failures_message(failed: Sequence[RunRecord], shown: int = 3) -> str:
    """'4 run(s) failed (2 diverged, 2 timeout): P8xG8-s0 diverged: ...; ...' with each distinct
    reason once (the first ``shown`` of them), so the user reads why rather than a count."""
    counts = Counter(r.status for r in failed)
    kinds = ", ".join(f"{n} {status}" for status, n in counts.most_common())
    seen: dict[str, str] = {}
    for r in failed:
        why = f": {r.reason}" if r.reason else ""
        seen.setdefault(r.reason or r.status, f"{r.run_id} {r.status}{why}")
    reasons = list(seen.values())
    more = f"; and {len(reasons) - shown} other reason(s) in run.json" if len(reasons) > shown else ""
    return f"{len(failed)} run(s) failed ({kinds}): " + "; ".join(reasons[:shown]) + more


def candidates_from_runs(
    runs: Sequence[RunData],
    *,
    metric: str,
    target: float,
    higher_is_better: bool = True,
    ema_alpha: float = 0.5,
    confidence: float = 0.9,
    families: dict[str, str] | None = None,
) -> list[CandidateEfficiency]:
    """Group runs by candidate and estimate samples-to-target over seeds (verdicts come later).

    Failed runs (diverged, OOM, ...) are reported. A diverged run never reached the target: beside
    a seed that did not fail it is censored at the samples it consumed, as a run that never reaches
    the target is (dropping it would read the survivors, biasing R low where a candidate diverges
    now and then, near its stability edge). OOM, timeout and failed runs say nothing of R and are
    left out; a candidate whose every run failed has no estimate.

    ``families`` maps label -> main | group_sweep | fixed_lr (the probe's plan knows it); otherwise
    fixed-LR controls are recognised by their rule and the group sweep by a group size other than
    the most common one.
    """
    if not runs:
        raise AnalysisError("no runs to analyse: run `batchtune probe` or import logs first")
    by_label: dict[str, list[RunData]] = defaultdict(list)
    for run in runs:
        by_label[run.record.candidate].append(run)
    failed = [r.record for r in runs if r.record.status in FAILED_STATUSES]
    if len(failed) == len(runs):
        raise RunsFailed(f"every run failed, so nothing can be estimated: {failures_message(failed)}")
    if not any(metric in s.metrics for r in runs for s in r.steps):
        found = sorted({k for r in runs for s in r.steps for k in s.metrics})
        also = f"; besides, {failures_message(failed)}" if failed else ""
        raise MetricMissingError(  # bad input (exit 2), as when a probe's first evaluation lacks it
            f"no run logged the target metric {metric!r}; the runs have: {', '.join(found) or 'none'} "
            f"(set target.metric, e.g. --set target.metric=NAME){also}"
        )
    main_g = Counter(r.record.group_size for r in runs).most_common(1)[0][0]
    out = []
    for lab, group in by_label.items():
        rec0 = group[0].record
        usable = [r for r in group if r.record.status not in FAILED_STATUSES]
        if usable:  # a diverged seed is censored beside them, not dropped (docstring)
            usable = [r for r in group if r.record.status not in _NOT_DATA]
        failures = tuple(
            f"seed {r.record.seed}: {r.record.status}" + (f" ({r.record.reason})" if r.record.reason else "")
            for r in group
            if r.record.status in FAILED_STATUSES
        )
        estimate = None
        if usable:
            crossings = [_crossing(r, metric, target, higher_is_better, ema_alpha) for r in usable]
            estimate = estimate_over_seeds(
                crossings, confidence=confidence, seed_ids=[r.record.seed for r in usable]
            )
        steps = [s for r in group for s in r.steps if s.step > 0 or s.samples > 0]
        timed = [s for s in steps if s.timed] or steps  # untimed entries' zeros would pull them down
        out.append(
            CandidateEfficiency(
                label=lab,
                prompts=rec0.prompts,
                group_size=rec0.group_size,
                lr=rec0.lr,
                lr_rule=rec0.lr_rule,
                family=(families or {}).get(lab) or _family(lab, rec0, main_g),
                estimate=estimate,
                verdict=None,
                n_runs=len(group),
                failures=failures,
                gen_s_per_step=_median([s.gen_s for s in timed]),
                train_s_per_step=_median([s.train_s for s in timed]),
                other_s_per_step=_median([s.other_s for s in timed]),
                samples_consumed=sum(r.record.samples for r in group),
                wall_s=sum(r.record.wall_s for r in group),
                critic_lr=rec0.critic_lr,
                # the probe's runs only: a log's step time may hold its evaluations (evals.py)
                evals=eval_cost([r.steps for r in group if not r.record.imported], metric),
            )
        )
    return out
