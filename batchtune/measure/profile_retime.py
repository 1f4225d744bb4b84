"""Re-time a contended throughput profile: bounded retries with backoff, the least-contended kept.

A profile timed while other processes held the cores is slower than the machine, by a different
factor at each point, so the ranking built on it can move with the load (issue 32: the same sample-
efficiency table picked P4xG8 on a loaded box and P8xG8 on a quiet one). The profile's contention
meter (measure/contention.py: other processes' CPU cores over each timed call, the profile's median
over its points) says when that happened. Where it reads contended
(analysis/system/contention.is_contended), the whole sweep is timed again after a wait, up to
`generation.retime_contended` more times, the wait doubling from `generation.retime_wait_s`; the
first reading that is not contended ends it, else the least contended of all is kept. Every attempt
is stored (its own profile id, in the order timed), the kept one last, so "the latest profile" of
the results directory, which recommend reads, is the kept one. `generation.retime_contended = 0`
only warns, as before; a simulated engine's computed times are never re-timed. The whole sweep, not
single points, is re-timed: points timed at different loads would bend the curve between neighbours,
which the interleaved repeats are there to prevent. The environment variable
BATCHTUNE_RETIME_CONTENDED, where set, overrides the count for every recipe (a CI box or a test
suite, always shared, sets it to 0).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from batchtune.analysis.system.contention import is_contended
from batchtune.analysis.system.profile import SIMULATED_DEVICE, ProfileResult
from batchtune.errors import InputError
from batchtune.recipe.schema import Recipe
from batchtune.records.types import ThroughputPoint


@dataclass(frozen=True)
class Attempt:
    points: list[ThroughputPoint]
    result: ProfileResult


ENV = "BATCHTUNE_RETIME_CONTENDED"


def retries(recipe: Recipe) -> int:
    """How many more times a contended profile is timed: the recipe's, or the environment's."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return recipe.generation.retime_contended
    try:
        return max(0, min(10, int(raw)))
    except ValueError:
        raise InputError(f"{ENV}={raw!r}: give a whole number of re-timings (0 = none)") from None


def _load(result: ProfileResult) -> float:
    """The attempt's contention, for choosing the least: unknown counts as none (it is not retried)."""
    return result.other_cores if math.isfinite(result.other_cores) else 0.0


def _wait(seconds: float) -> None:
    time.sleep(seconds)


def least_contended(
    recipe: Recipe, time_once: Callable[[int], Attempt], sleep: Callable[[float], None] | None = None
) -> tuple[Attempt, list[Attempt]]:
    """``time_once(i)`` (attempt i from 0) until one is not contended or the retries are spent;
    returns the kept attempt and every attempt in the order timed."""
    g = recipe.generation
    attempts = [time_once(0)]
    wait = g.retime_wait_s
    most = retries(recipe)
    while len(attempts) <= most:
        last = attempts[-1].result
        if last.device == SIMULATED_DEVICE or not is_contended(last.other_cores, last.cpu_cores):
            break  # quiet, or computed times (the simulated engine) that no load can bend
        (sleep or _wait)(wait)
        attempts.append(time_once(len(attempts)))
        wait *= 2
    kept = min(attempts, key=lambda a: _load(a.result))  # the first of equals: the earliest
    return kept, attempts


def retime_note(recipe: Recipe, kept: Attempt, attempts: list[Attempt]) -> str:
    """What re-timing did, for the profile's output ("" when the first timing was not contended)."""
    first = attempts[0].result
    if first.device == SIMULATED_DEVICE or not is_contended(first.other_cores, first.cpu_cores):
        return ""
    cores = first.cpu_cores
    if len(attempts) == 1:
        return f"not re-timed (generation.retime_contended or {ENV} is 0)"
    readings = ", ".join(f"{a.result.other_cores:.1f}" for a in attempts)
    g = recipe.generation
    waits = [g.retime_wait_s * 2**i for i in range(len(attempts) - 1)]
    waited = " + ".join(f"{w:g}" for w in waits)
    which = attempts.index(kept) + 1
    still = " (still contended)" if is_contended(kept.result.other_cores, cores) else ""
    return (
        f"the first timing was contended, so the profile was timed {len(attempts)} times (waits of "
        f"{waited} s between); other processes' cores over each: {readings} of {cores}; kept timing "
        f"{which}, the least contended{still} (generation.retime_contended = 0 turns this off)"
    )
