"""The attack drills of benchmarks/attack_drills.py (issue 33), as a test: every case is refused
with exit 2 and nothing runs or is written outside. About 40 s (a branched
pre-training probe and an NQM probe to attack, then a fresh process per case)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attack_drills import attacks, report  # noqa: E402


@pytest.mark.slow
def test_every_attack_drill_is_refused_without_a_breach(tmp_path: Path) -> None:
    cases = attacks(tmp_path)
    assert len(cases) == 6
    assert all(c["exit"] == 2 and not c["breach"] for c in cases), report(cases)
