"""One small NQM probe (3 batches x 2 seeds of a 100-dim NQM, to loss 3.0) that several test files
read: run once per session by the ``small_nqm`` fixture (tests/conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from batchtune.recipe.load import shipped_recipes

NQM = str(shipped_recipes()["nqm"])
SMALL = [
    *("--set", "candidates.prompts=[1,4,16]", "--set", "budget.seeds=[0,1]"),
    *("--set", "budget.max_samples=4096", "--set", "target.value=3.0", "--set", "nqm.dim=100"),
]


def run_small_probe(results: Path) -> str:
    """Probe ``results`` with SMALL; the --json output."""
    from typer.testing import CliRunner

    from batchtune.cli import app

    out = CliRunner().invoke(app, ["probe", NQM, "-r", str(results), *SMALL, "--json"])
    assert out.exit_code == 0, out.output
    return out.stdout


def copy_of(finished: Path, dest: Path) -> Path:
    """A copy of the shared probe to change or to write into (recommend adds its plot)."""
    shutil.copytree(finished, dest)
    return dest
