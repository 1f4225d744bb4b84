"""What held-out evaluation costs a run, from the steps a probe recorded.

A confirming run evaluates as the probe's runs did, so its wall time is its training time plus

    evals(R) * eval_s,   evals(R) = 1 + floor(R / samples_per_eval)

(one evaluation at the start, then one every ``samples_per_eval``). Both factors are read from the
runs themselves: ``eval_s`` is the median over evaluations of the time a step spent evaluating, a
step-0 evaluation's ``other_s`` whole (it does nothing else), a later evaluating step's ``other_s``
less the median ``other_s`` of its run's steps that did not evaluate (reward, reference log-probs);
``samples_per_eval`` is the median gap in samples between consecutive evaluations. Runs imported from
a trainer's logs are left out (analysis/sample/candidates.py): `recommend` ranks them by their logs'
whole step time, which holds their evaluations where the trainer timed them inside its step, so
their evaluating steps' extra time is not an evaluation cost to add on top. Pure: records in,
numbers out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from batchtune.records.types import StepRecord


@dataclass(frozen=True)
class EvalCost:
    eval_s: float  # median wall seconds of one evaluation; nan: the runs show none
    samples_per_eval: float  # median samples between evaluations; nan: fewer than two in any run
    evals_seen: int  # evaluations the median is over


NO_EVALS = EvalCost(math.nan, math.nan, 0)


def eval_cost(runs: Sequence[Sequence[StepRecord]], metric: str) -> EvalCost:
    """The evaluation cost of ``runs`` (each its steps in order), an evaluation being a step that
    logged ``metric``. A run whose every step logs it (a training metric, the NQM's loss) has no
    steps to tell evaluation from training by, so only its step-0 record, if any, counts."""
    times: list[float] = []
    gaps: list[float] = []
    for steps in runs:
        evals = [s for s in steps if metric in s.metrics]
        rest = [s.other_s for s in steps if metric not in s.metrics and s.step > 0]
        base = statistics.median(rest) if rest else None
        for s in evals:
            if s.step == 0 and s.samples == 0 and s.timed:
                times.append(s.other_s)
            elif base is not None and s.timed:
                times.append(max(0.0, s.other_s - base))
        pairs = zip(evals, evals[1:], strict=False)
        gaps += [float(b.samples - a.samples) for a, b in pairs if b.samples > a.samples]
    return EvalCost(
        statistics.median(times) if times else math.nan,
        statistics.median(gaps) if gaps else math.nan,
        len(times),
    )


def evals_to(samples: float, cost: EvalCost) -> int:
    """Evaluations a run makes on its way to ``samples``: one at the start, then one every
    ``cost.samples_per_eval`` (0 when the cadence is unknown)."""
    if not (math.isfinite(samples) and math.isfinite(cost.samples_per_eval) and cost.samples_per_eval > 0):
        return 0
    return 1 + math.floor(samples / cost.samples_per_eval)
