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
    # every round ran its overlapped calibration and each setting once, calibration and run
    for got in raw["rounds"]:
        assert got["pair"] and sorted(tuple(one["setting"]) for one in got["runs"]) == sorted(pvm.SETTINGS)
        assert all(one["cal"] and one["run"] for one in got["runs"])
