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


def test_the_product_convention_table_is_recomputed_from_the_same_data() -> None:
    """benchmarks/pipeline_vs_measured_product.py's committed table (quoted in docs/async.md) is what
    the two committed invocations' data give through the product's ranking code as it is now."""
    bench = ROOT / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        spec = importlib.util.spec_from_file_location(
            "pipeline_vs_measured_product", bench / "pipeline_vs_measured_product.py"
        )
        assert spec is not None and spec.loader is not None
        pvp = importlib.util.module_from_spec(spec)
        sys.modules["pipeline_vs_measured_product"] = pvp
        spec.loader.exec_module(pvp)
    finally:
        sys.path.remove(str(bench))
    raws = [(p.name, json.loads(p.read_text())) for p in pvp.RAWS]
    assert pvp.tabulate(raws) == pvp.OUT.read_text()
