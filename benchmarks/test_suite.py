"""How long the README's test command takes: the default suite, then the slow one, as `.ci/run` runs them.

Run it from a clean checkout (e.g. `git worktree add /tmp/wt HEAD`) so that nothing uncommitted is
measured; it prints the commit, the machine and the closing line of each pytest run with its wall time.

    python benchmarks/test_suite.py > benchmarks/out/test_suite.txt
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def _closing_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1].strip("= ") if lines else "(no output)"


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "log", "-1", "--format=%h %cs"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    print(f"commit {head.stdout.strip()}{' (with uncommitted changes)' if dirty.stdout.strip() else ''}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    status = 0
    for label, extra in (("default", ["-n", "auto", "--dist", "loadfile"]), ("slow", ["-m", "slow"])):
        load = os.getloadavg()[0]
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *extra],
            cwd=root,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        command = f"pytest -q {' '.join(extra)}".strip()
        print(f"{label:8s} {command:38s} {_closing_line(proc.stdout)}  (wall {wall:.0f} s, load {load:.1f})")
        for line in proc.stdout.splitlines():  # which test failed, when one did
            if line.startswith(("FAILED ", "ERROR ")):
                print(f"         {line}")
        status = status or proc.returncode
    return status


if __name__ == "__main__":
    raise SystemExit(main())
