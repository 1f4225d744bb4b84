"""Progress callbacks: the measuring layer calls them, the report layer draws them (no import between)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# probe events: ("plan" | "start" | "step" | "end", info), e.g. ("step", {"run_id", "samples", "max_samples"})
ProbeEvents = Callable[[str, dict[str, Any]], None]
# a sweep's progress: (done, total, description)
SweepProgress = Callable[[int, int, str], None]
