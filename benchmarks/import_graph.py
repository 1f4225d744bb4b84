"""The package's import graph and size limits, measured from the source (docs/architecture.md).

Nodes: each top-level folder of `batchtune/` as one node (`analysis`, `measure`, ...), each top-level
file as its own (`records`, `codec`, ...); `__init__`/`__main__` of the package are left out. Edges:
an import of one node by another, lazy imports (inside functions) included, `if TYPE_CHECKING:` blocks
left out. Layers: the longest chain of edges, counted in nodes, after the cycles are merged (a cycle
counts once). Upward: edges inside a cycle (an arrow back up to a node that reaches it). Also: files
over 400 lines and functions over 80 lines (the limits of issue 29).

    python benchmarks/import_graph.py            # prints the table, writes benchmarks/out/import_graph.txt
    python benchmarks/import_graph.py --edges    # and lists every edge
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "batchtune"
OUT = ROOT / "benchmarks" / "out" / "import_graph.txt"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 80


def node_of(module: str) -> str | None:
    """The graph node of a dotted module name under batchtune (None: the package itself, or outside)."""
    parts = module.split(".")
    if parts[0] != "batchtune" or len(parts) < 2 or parts[1] in ("__init__", "__main__"):
        return None
    return parts[1]


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports(tree: ast.AST, package: str) -> list[str]:
    """Every module ``tree`` imports (absolute names; relative ones resolved against ``package``)."""
    out: list[str] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            out += [base, *(f"{base}.{a.name}" for a in node.names)]
        todo.extend(ast.iter_child_nodes(node))
    return out


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts)
        src = node_of(module)
        if src is None:
            continue
        edges[src]  # a node with no arrows out still counts
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for name in imports(ast.parse(path.read_text(encoding="utf-8")), package):
            dst = node_of(name)
            if dst is not None and dst != src and ((PKG / dst).is_dir() or (PKG / f"{dst}.py").exists()):
                edges[src].add(dst)
    return edges


def components(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def layers(edges: dict[str, set[str]], comps: list[list[str]]) -> int:
    """The longest chain of imports, in nodes, with each cycle merged into one node."""
    comp_of = {v: i for i, c in enumerate(comps) for v in c}
    down: dict[int, set[int]] = defaultdict(set)
    for v, ws in edges.items():
        for w in ws:
            if comp_of[v] != comp_of[w]:
                down[comp_of[v]].add(comp_of[w])
    depth: dict[int, int] = {}

    def d(c: int) -> int:
        if c not in depth:
            depth[c] = 1 + max((d(x) for x in down[c]), default=0)
        return depth[c]

    return max((d(c) for c in range(len(comps))), default=0)


def sizes() -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(files over the line limit, functions over theirs), longest first."""
    files, functions = [], []
    for path in sorted(PKG.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = str(path.relative_to(ROOT))
        if text.count("\n") > MAX_FILE_LINES:
            files.append((text.count("\n"), rel))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    functions.append((n, f"{rel}:{node.name}"))
    return sorted(files, reverse=True), sorted(functions, reverse=True)


def report(list_edges: bool = False) -> str:
    edges = graph()
    comps = components(edges)
    cycles = [c for c in comps if len(c) > 1]
    in_cycles = {v for c in cycles for v in c}
    upward = sum(1 for v, ws in edges.items() for w in ws if v in in_cycles and w in in_cycles)
    files, functions = sizes()
    lines = [
        "import graph of batchtune/ (top-level folders one node each; lazy imports counted)",
        f"nodes                     {len(edges)}",
        f"edges                     {sum(len(ws) for ws in edges.values())}",
        f"layers                    {layers(edges, comps)}",
        f"cycles                    {len(cycles)}" + "".join(f"  [{' <-> '.join(c)}]" for c in cycles),
        f"edges inside a cycle      {upward}",
        f"files > {MAX_FILE_LINES} lines          {len(files)}",
        f"functions > {MAX_FUNCTION_LINES} lines       {len(functions)}",
    ]
    if list_edges:
        lines += [f"  {v} -> {w}" for v in sorted(edges) for w in sorted(edges[v])]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="also list every edge (not written to the file)")
    args = parser.parse_args()
    text = report()
    OUT.write_text(text)
    print(report(args.edges), end="")


if __name__ == "__main__":
    main()
