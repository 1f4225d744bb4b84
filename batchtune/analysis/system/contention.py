"""Whether a timing was taken on a busy machine: the thresholds and the warning (pure; the meter that
records the load is batchtune.measure.contention)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from batchtune.records.types import ThroughputPoint

# other processes keeping this many CPU cores busy on average (or this fraction of the machine's cores,
# whichever is more) while a profile was timed make it "contended": its times are slower than the
# machine's, and by a different factor at each point
CONTENDED_CORES = 0.5
CONTENDED_FRACTION = 0.25


def median_other_cores(points: Sequence[ThroughputPoint]) -> float:
    seen = [p.other_cores for p in points if p.status == "ok" and math.isfinite(p.other_cores)]
    return float(statistics.median(seen)) if seen else math.nan


def is_contended(other_cores: float, cpu_cores: int) -> bool:
    """Whether other work on ``other_cores`` of ``cpu_cores`` cores could have bent a timing."""
    return math.isfinite(other_cores) and other_cores >= max(CONTENDED_CORES, CONTENDED_FRACTION * cpu_cores)


def contention_note(other_cores: float, cpu_cores: int) -> str | None:
    """The warning a contended profile carries into every ranking made from it."""
    if not is_contended(other_cores, cpu_cores):
        return None
    of = f" of {cpu_cores}" if cpu_cores else ""
    return (
        f"the throughput profile was timed while other processes kept {other_cores:.1f}{of} CPU cores busy "
        "(median over its points): its times are slower than this machine's, unevenly, and the pick may "
        "move; rerun `batchtune profile-gen` on a quiet machine"
    )
