"""No file in batchtune/ over 400 lines, no function over 80 (issue 29; STYLE: split by responsibility)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "benchmarks" / "import_graph.py")
assert _spec is not None and _spec.loader is not None
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)


def test_no_file_or_function_over_the_limits():
    files, functions = import_graph.sizes()
    assert not files, f"over 400 lines: {sorted(p for _, p in files)}"
    assert not functions, f"over 80 lines: {sorted(p for _, p in functions)}"
