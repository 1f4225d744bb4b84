"""Does the pick survive the throughput's own noise? Perturb each candidate's Θ within its spread.

The ranking orders by expected time ``E[T] = E[R] / Θ`` and treats Θ as exact (ranking.py). A
profile's repeats disagree by a few %, more on a loaded machine, and two default `tune` runs whose
sample-efficiency tables were identical picked different batches from their profiles alone (issue
32). This check draws every candidate's throughput independently, log-uniform within ``±spread``
(its profile's measured repeat half-range, ``Throughput.spread``: (max - min) / 2 over the repeats
of the points it is predicted from, relative to the step), re-applies the ranking's own winner rule
(the smallest batch whose expected time is within ``1 + tie_margin`` of the fastest; a censored
candidate never wins) and counts how often the pick stays. Independent draws are the harsh case: a
load that slows every point alike moves no ratio. R is held at its estimate: its own uncertainty is
the regret bound's (ranking.regret_bound), not this.

A candidate without a measured spread (probe timings, one repeat) takes the median of those that have
one; with none measured the check is not made (None), and computed times (a simulation: spread 0)
always hold.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from batchtune.analysis.decide.ranking import Ranking
from batchtune.records.types import ThroughputPoint

DRAWS = 4000
HOLDS = 0.95  # below this share of draws the pick and its rivals are "within throughput noise"


@dataclass(frozen=True)
class NoiseCheck:
    winner: str
    holds: float  # share of draws in which the pick stays the pick
    draws: int
    spreads: dict[str, float]  # each candidate's relative half-range, as drawn
    rivals: dict[str, float]  # every other candidate that won some draws: its share, largest first
    tie_margin: float

    @property
    def within_noise(self) -> bool:
        return self.holds < HOLDS

    def text(self) -> str:
        finite = [s for s in self.spreads.values() if math.isfinite(s)]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
        band = f"±{hi:.1%}" if math.isclose(lo, hi) else f"±{lo:.1%} to ±{hi:.1%}"
        base = (
            f"the pick {self.winner} holds in {self.holds:.0%} of {self.draws:,} draws of each candidate's "
            f"throughput within its measured repeat spread ({band})"
        )
        if not self.rivals:
            return f"Throughput noise: {base}."
        others = ", ".join(f"{k} {v:.0%}" if v >= 0.005 else f"{k} <1%" for k, v in self.rivals.items())
        if not self.within_noise:
            return f"Throughput noise: {base}; the rest go to {others}."
        close = [self.winner, *(k for k, v in self.rivals.items() if v >= 0.05)]
        names = " and ".join(close) if len(close) < 3 else ", ".join(close[:-1]) + f" and {close[-1]}"
        return (
            f"Throughput noise: {names} are within throughput noise: {base}; the rest go to {others}. "
            f"The pick stays by the ranking's stated rule (the smallest batch within {self.tie_margin:.0%} "
            "of the fastest expected time); a re-timed profile can move it within this set"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "holds": self.holds,
            "draws": self.draws,
            "within_noise": self.within_noise,
            "rivals": dict(self.rivals),
            "spreads": {k: (v if math.isfinite(v) else None) for k, v in self.spreads.items()},
        }


def winners(
    expected: np.ndarray, batch: np.ndarray, censored: np.ndarray, tie_margin: float
) -> np.ndarray:
    """The ranking's winner rule per row of ``expected`` (draws x candidates): the index of the
    smallest batch whose expected time is within ``1 + tie_margin`` of the row's fastest."""
    e = np.where(censored[None, :], np.inf, expected)
    near = e.min(axis=1, keepdims=True) * (1.0 + tie_margin)
    eligible = e <= near
    key = np.where(eligible, batch[None, :], np.inf)
    return np.asarray(np.argmin(key, axis=1))


def pick_under_noise(
    ranking: Ranking,
    spreads: Mapping[str, float],
    tie_margin: float,
    draws: int = DRAWS,
    seed: int = 0,
) -> NoiseCheck | None:
    """How often the pick survives each candidate's throughput drawn within its spread (module doc);
    None when no candidate has a measured spread."""
    cands = list(ranking.candidates)
    known = [spreads[c.name] for c in cands if math.isfinite(spreads.get(c.name, math.nan))]
    if not known:
        return None
    fill = statistics.median(known)
    used = {c.name: spreads.get(c.name, math.nan) for c in cands}
    used = {k: (v if math.isfinite(v) else fill) for k, v in used.items()}
    half = np.array([math.log1p(max(0.0, used[c.name])) for c in cands])
    rng = np.random.default_rng(seed)
    u = rng.uniform(-1.0, 1.0, size=(draws, len(cands))) * half[None, :]
    expected = np.array([c.expected_time_s for c in cands])[None, :] * np.exp(-u)  # Θ x e^u
    batch = np.array([c.batch_responses for c in cands], dtype=float)
    censored = np.array([c.censored for c in cands])
    won = winners(expected, batch, censored, tie_margin)
    counts = np.bincount(won, minlength=len(cands)) / draws
    w = [c.name for c in cands].index(ranking.winner)
    rivals = {cands[i].name: float(counts[i]) for i in np.argsort(-counts) if i != w and counts[i] > 0}
    return NoiseCheck(ranking.winner, float(counts[w]), draws, used, rivals, tie_margin)


def point_spread(points: Sequence[ThroughputPoint], at: float) -> float:
    """The relative repeat half-range of the profile point nearest ``at`` (log scale); NaN with
    fewer than two repeats there."""
    ok = [p for p in points if p.status == "ok" and p.step_latency_s > 0]
    if not ok or at <= 0:
        return math.nan
    p = min(ok, key=lambda q: abs(math.log(q.concurrency / at)))
    return p.step_latency_spread_s / p.step_latency_s if p.repeats >= 2 else math.nan


def step_spread(gen_s: float, gen_rel: float, train_s: float, train_rel: float, other_s: float) -> float:
    """A step's relative half-range from its parts' (the two aligned, the worst case; other_s exact)."""
    total = gen_s + train_s + other_s
    return (gen_s * gen_rel + train_s * train_rel) / total if total > 0 else math.nan
