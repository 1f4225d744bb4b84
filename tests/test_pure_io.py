"""analysis/ is the pure layer: it takes numbers and records and never reads or writes a file
itself (the readers live in integrations/ and records/). Checked on the source with the AST."""

from __future__ import annotations

import ast
from pathlib import Path

ANALYSIS = Path(__file__).resolve().parents[1] / "batchtune" / "analysis"
FILE_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "load", "dump", "loadtxt",
              "genfromtxt", "savetxt", "fromfile", "tofile", "DictReader", "reader", "writer", "DictWriter",
              "iterdir", "glob", "rglob"}  # fmt: skip
FILE_MODULES = {"csv", "io", "json", "pickle", "shutil", "tempfile", "sqlite3", "gzip"}


def file_access(source: str) -> list[str]:
    """Each call that reads or writes a file, and each import of a file-format module, by line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = getattr(func, "id", "") or getattr(func, "attr", "")
            if name in FILE_CALLS:
                found.append(f"{node.lineno}: calls {name}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{node.lineno}: imports {m}" for m in mods if m.split(".")[0] in FILE_MODULES]
    return found


def test_analysis_opens_no_file():
    bad = [f"{p.relative_to(ANALYSIS.parent)}:{hit}" for p in sorted(ANALYSIS.rglob("*.py"))
           for hit in file_access(p.read_text(encoding="utf-8"))]  # fmt: skip
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_reader():
    """The check is not vacuous: the reading moved out of analysis/ is caught if written back."""
    assert file_access("import csv\nfrom pathlib import Path\nPath('x').read_text()\n") == [
        "1: imports csv",
        "3: calls read_text",
    ]
    assert file_access("with open('f') as fh:\n    json.load(fh)\n") == ["1: calls open", "2: calls load"]
