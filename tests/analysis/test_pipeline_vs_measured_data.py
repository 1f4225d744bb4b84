"""benchmarks/pipeline_vs_measured.py's committed table is what its committed per-step data gives
(``--from``): the figures quoted in docs/async.md come from the runs' own timers, recomputed here
through the pipeline model, shared_device and fit_contention as they are now."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_table_is_recomputed_from_its_data() -> None:
    spec = importlib.util.spec_from_file_location("pvm", ROOT / "benchmarks" / "pipeline_vs_measured.py")
    assert spec is not None and spec.loader is not None
    pvm = importlib.util.module_from_spec(spec)
    sys.modules["pvm"] = pvm  # its dataclasses look their module up
    spec.loader.exec_module(pvm)
    raw = json.loads(pvm.RAW.read_text())
    assert pvm.tabulate(raw) == pvm.OUT.read_text()
    # every overlapped setting had its overlapped calibration; k = 0 had none (c = 1 there)
    assert all(("pair" in got) == (got["setting"][0] >= 1) for got in raw["runs"])
