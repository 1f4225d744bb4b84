"""The import graph's size stays within issue 29's limits (benchmarks/import_graph.py counts it)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "benchmarks" / "import_graph.py")
assert _spec is not None and _spec.loader is not None
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)


def test_at_most_65_edges_and_11_layers():
    edges = import_graph.graph()
    n_edges = sum(len(ws) for ws in edges.values())
    depth = import_graph.layers(edges, import_graph.components(edges))
    assert n_edges <= 65 and depth <= 11, (n_edges, depth)


def test_no_cycle_between_folders():
    edges = import_graph.graph()
    assert [c for c in import_graph.components(edges) if len(c) > 1] == []


def test_the_counter_reads_lazy_imports_and_skips_type_checking():
    src = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from batchtune.measure import probe\n"
        "def f():\n    from batchtune.records import ResultsStore\n"
    )
    found = import_graph.imports(ast.parse(src), "batchtune.analysis")
    assert "batchtune.records" in found and "batchtune.measure" not in found


def test_cycles_and_layers_of_a_small_graph():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"b", "d"}, "d": set()}
    comps = import_graph.components(edges)
    assert [c for c in comps if len(c) > 1] == [["b", "c"]]
    assert import_graph.layers(edges, comps) == 3  # a -> {b, c} -> d
