"""More seeds where the async decision hinges (issue 30): the seed top-up of the async probe.

Why: a candidate near its stability edge (a large staleness k with reuse u) can look fast on a few
seeds that all agree, while its expected time is carried by rare large excursions that only more
seeds show (benchmarks/async_nqm_sequential.py: the 3-seed pick had regret 1.741 on such an NQM
instance). Seed disagreement cannot flag it; being close to the best can.

The rule: after the planned seeds, every candidate whose estimated time-to-target T (its best row of
the joint ranking) is within a factor (1 + margin) of the best estimate is topped up to ``top``
seeds; the estimates are made again with the new seeds, and the next round tops up the candidates
that are now contenders, until no contender lacks seeds. Each candidate is topped up at most once
(a run that fails does not make it a contender again). A best T that is not finite (no candidate
reached the target) names no contender: more seeds of runs that never reach the target do not rank.

The margin (0.1) and the top (8 seeds) were chosen on held-out NQM instances (other noise, curvature
and gen:train ratios than the reported ones) by benchmarks/async_nqm_sequential.py, which runs this
very loop. Pure, no I/O: ``top_up`` takes the estimate and the runner as functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from batchtune.errors import AnalysisError

MARGIN = 0.1  # contenders: T within (1 + MARGIN) x the best estimate
TOP_SEEDS = 8  # each contender's seeds after its top-up


@dataclass(frozen=True)
class TopUp:
    """One candidate topped up in a round, and why."""

    label: str
    t: float  # its estimated T when it was chosen
    seeds_before: int


@dataclass(frozen=True)
class TopUpRound:
    best: str  # the best estimate's candidate in this round
    best_t: float
    topped: tuple[TopUp, ...]

    def words(self, margin: float, top: int) -> str:
        """The round in one line: who was topped up, from how many seeds, and why."""
        who = ", ".join(
            f"{t.label} (T {t.t:.4g} s, {t.t / self.best_t:.3f}x the best; {t.seeds_before} -> {top} seeds)"
            for t in self.topped
        )
        return f"best estimate {self.best} at T {self.best_t:.4g} s; within {margin:.0%} of it: {who}"


def contenders(
    t: Mapping[str, float],
    seeds: Mapping[str, int],
    *,
    margin: float = MARGIN,
    top: int = TOP_SEEDS,
    done: Sequence[str] = (),
) -> list[str]:
    """The candidates to top up now: T within (1 + margin) x the best, fewer than ``top`` seeds, and
    not topped up before (``done``), in the order of ``t``."""
    finite = [v for v in t.values() if math.isfinite(v)]
    if not finite:
        return []
    best = min(finite)
    return [
        lab
        for lab, v in t.items()
        if v <= (1.0 + margin) * best and seeds.get(lab, 0) < top and lab not in done
    ]


def top_up(
    estimate: Callable[[], tuple[Mapping[str, float], Mapping[str, int]]],
    run: Callable[[list[str]], None],
    *,
    margin: float = MARGIN,
    top: int = TOP_SEEDS,
    done: Sequence[str] = (),
    on_round: Callable[[TopUpRound], None] | None = None,
) -> list[TopUpRound]:
    """Run the rounds of the module docstring. ``estimate()``: (T per candidate, seeds per candidate)
    from the runs so far; ``run(labels)``: bring each of ``labels`` to ``top`` seeds; ``done``:
    candidates topped up earlier (a resumed probe's record); ``on_round``: called with each round
    before its runs start (so a probe can record it). Returns the rounds run here."""
    if not margin >= 0:  # inf: every candidate is a contender (top seeds everywhere)
        raise AnalysisError(f"the top-up margin must be a share >= 0, not {margin}")
    rounds: list[TopUpRound] = []
    spent = list(done)
    while True:
        t, seeds = estimate()
        todo = contenders(t, seeds, margin=margin, top=top, done=spent)
        if not todo:
            return rounds
        best = min((lab for lab in t if math.isfinite(t[lab])), key=lambda lab: t[lab])
        rnd = TopUpRound(best, t[best], tuple(TopUp(lab, t[lab], seeds.get(lab, 0)) for lab in todo))
        rounds.append(rnd)
        if on_round is not None:
            on_round(rnd)
        spent += todo
        run(todo)


def best_times(rows: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Each candidate's least T over its rows ((label, T) pairs of a joint ranking)."""
    out: dict[str, float] = {}
    for lab, t in rows:
        out[lab] = min(out.get(lab, math.inf), t)
    return out
