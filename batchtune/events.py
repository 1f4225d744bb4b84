"""Progress callbacks: the measuring layer calls them, the report layer draws them (no import between)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# probe events: ("plan" | "start" | "step" | "end" | "wait", info), e.g. ("step", {"run_id", "samples",
# "max_samples"}); a branched probe's "plan" has total and todo None (its search decides how many runs)
ProbeEvents = Callable[[str, dict[str, Any]], None]
# a sweep's progress: (done, total, description)
SweepProgress = Callable[[int, int, str], None]
