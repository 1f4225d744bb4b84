"""Docs are measured, not remembered: every quoted output equals the committed file it quotes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quoted_outputs_match_their_files():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sync_docs.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, "stale figures (run python benchmarks/sync_docs.py):\n" + out.stdout


def test_the_check_catches_a_stale_block(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import sync_docs
    finally:
        sys.path.pop(0)
    out = tmp_path / "fig.txt"
    out.write_text("median 1.00\n")
    doc = tmp_path / "doc.md"
    doc.write_text(f"<!-- include: {out} -->\n```text\nmedian 0.90\n```\n<!-- end include -->\n")
    monkeypatch.setattr(sync_docs, "ROOT", tmp_path)
    assert sync_docs.sync(doc, check=True)  # stale: named
    sync_docs.sync(doc, check=False)
    assert "median 1.00" in doc.read_text() and not sync_docs.sync(doc, check=True)


def test_docs_cite_no_notes_that_do_not_ship():
    bad = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "recipes").glob("*.toml")]
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "METHOD.md" in line or "METHOD §" in line or "../shared/" in line
    ]
    assert not bad, bad
