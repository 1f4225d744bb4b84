"""A file-size limit (or a full disk) is the environment, not a bug: exit 2 naming the file (issue 12).

The child caps RLIMIT_FSIZE and ignores SIGXFSZ, so a write past the cap fails with EFBIG, as a
full disk fails with ENOSPC, instead of killing the process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import resource, signal, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from batchtune.cli import app
sys.argv = ["batchtune", *sys.argv[2:]]
app()
"""


@pytest.mark.parametrize(
    ("limit_bytes", "named"),
    [(2_000, "manifest.json"), (100_000, "steps.jsonl")],  # an atomic rewrite; an appended log
)
def test_file_size_limit_exits_2_naming_the_file(tmp_path, limit_bytes, named):
    pytest.importorskip("resource")
    out = tmp_path / "r"
    args = ["probe", "nqm", "-r", str(out), "--set", "budget.seeds=[0]", "--set", "candidates.prompts=[1,2]"]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(limit_bytes), *args], capture_output=True, text=True, timeout=60
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith(f"error: {out}") and named in lines[0] and "File too large" in lines[0]
    assert not list(out.glob(".*.tmp"))  # the failed atomic write left no temporary file


def test_writers_outside_the_results_store_name_their_file_too(tmp_path):
    """`recipes cp` (and every other writer: --emit --out, --junit, plots, the report) goes through
    one atomic writer: past the limit, exit 2 naming the file, no half-written file left behind."""
    pytest.importorskip("resource")
    dest = tmp_path / "mine.toml"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, "200", "recipes", "cp", "nqm", str(dest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and str(dest) in lines[0] and "File too large" in lines[0]
    assert not dest.exists() and not list(tmp_path.glob(".*.tmp"))
