"""measure/execute.Runner: one pool of worker processes for many batches of runs, stopped cleanly."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[2]


def quick_run(*args: object, events: object = None, parallel_runs: int = 1) -> None:
    """A run function for the pool (importable by a spawned worker): runs nothing."""
    return None


def test_an_error_in_the_driver_stops_idle_workers_without_a_traceback() -> None:
    """A probe that stops on an error (here: exit 3 once the pool's workers are idle) says it in one
    line; its idle workers used to each print the traceback of their wait on the pool's queue."""
    script = textwrap.dedent(
        """
        from batchtune.recipe.load import load_recipe
        from batchtune.measure.execute import Runner
        from tests.measure.test_runner import quick_run

        if __name__ == "__main__":
            with Runner(load_recipe("recipes/nqm.toml", ["run.workers=2"]), None) as runner:
                runner.run(quick_run, [(), ()])
                runner.run(quick_run, [(), ()])  # the same pool again
                raise SystemExit(3)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 3, out.stderr
    # (what the workers printed; CPython's own resource tracker may still warn at exit, not checked)
    assert "Terminated" not in out.stderr and "measure/execute.py" not in out.stderr, out.stderr
