"""Progress callbacks: the measuring layer calls them, the report layer draws them (no import between)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# probe events: ("plan" | "start" | "step" | "end" | "wait" | "retry", info), e.g. ("step", {"run_id",
# "samples", "max_samples"}); a branched probe's "plan" has total and todo None (its search decides how
# many runs); "wait" and "retry" carry "run_ids" and a "message" (runs another process holds; runs
# that failed before training last time, run again)
ProbeEvents = Callable[[str, dict[str, Any]], None]
# a sweep's progress: (done, total, description)
SweepProgress = Callable[[int, int, str], None]
