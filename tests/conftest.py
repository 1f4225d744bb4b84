"""Test-suite settings shared by every test (and by the CLI subprocesses tests start)."""

from __future__ import annotations

import os

# the suite runs on shared machines, where nearly every throughput profile reads contended: time
# each profile once (tests of the re-timing itself unset this; measure/profile_retime.py)
os.environ.setdefault("BATCHTUNE_RETIME_CONTENDED", "0")
