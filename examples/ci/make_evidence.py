"""Regenerate the results the CI examples check against (committed under examples/ci/evidence/).

    python examples/ci/make_evidence.py

Runs the noisy-quadratic-model probe and its simulated generation profile (recipes/nqm.toml: a
simulation with a known answer, seconds on a CPU, nothing downloaded) into examples/ci/evidence/nqm.
Also writes examples/ci/baseline.json (`check --json` of the passing verl config). Every number
the examples' `batchtune check` reads comes from this run; nothing is typed by hand.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "evidence" / "nqm"
KEEP_STEPS = 30  # logged points per run kept in the committed copy


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    for command in ("probe", "profile-gen"):
        subprocess.run(
            [sys.executable, "-m", "batchtune", command, "recipes/nqm.toml", "--results", str(OUT), "--json"],
            check=True,
            stdout=subprocess.DEVNULL,
            cwd=HERE.parent.parent,
        )
    shutil.rmtree(OUT / "plots", ignore_errors=True)  # images: not evidence, not committed
    for lock in OUT.rglob(".*lock"):
        lock.unlink()
    for steps in OUT.glob("runs/*/steps.jsonl"):  # keep the files small: every k-th step, and the last
        lines = steps.read_text().splitlines()
        if not lines:
            continue
        k = max(1, -(-len(lines) // KEEP_STEPS))
        kept = lines[::k] if lines[::k][-1] == lines[-1] else [*lines[::k], lines[-1]]
        steps.write_text("\n".join(kept) + "\n")
    baseline = subprocess.run(  # the passing verl config's predicted time-to-target, for --baseline
        [sys.executable, "-m", "batchtune", "check", "examples/ci/verl/ppo_trainer.yaml", "--results",
         str(OUT.relative_to(HERE.parent.parent)), "--json"],
        check=True, capture_output=True, text=True, cwd=HERE.parent.parent,
    )  # fmt: skip
    (HERE / "baseline.json").write_text(baseline.stdout)
    print(f"wrote {OUT} and {HERE / 'baseline.json'}")


if __name__ == "__main__":
    main()
