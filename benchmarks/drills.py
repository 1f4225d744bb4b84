"""Reliability drills, long version: random kill -9s of a command-backend probe (a slow fake trainer run
as a grandchild through `sh -c`), counting orphans left and resumes whose answer differs from an
uninterrupted probe. The short versions are tests/test_drills.py.

    python benchmarks/drills.py --kills 100 --workers 1 > benchmarks/out/drills.txt
    python benchmarks/drills.py --attacks-only > benchmarks/out/drills_attacks.txt

``--attacks`` adds the attack drills of benchmarks/attack_drills.py (a malicious checkpoint, YAML
bombs, a symlink escape) before the kills; ``--attacks-only`` runs them alone (about 20 s).

Prints one line per kill, then a summary and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.drill_kit import kill_mid_probe, probe_cmd, summary, trainer_pids, wait_dead, write_command_recipe  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--kills-per-resume", type=int, default=4, help="kills before each checked resume")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attacks", action="store_true", help="also the attack drills, first")
    ap.add_argument("--attacks-only", action="store_true", help="only the attack drills")
    a = ap.parse_args()
    if a.attacks or a.attacks_only:
        from benchmarks.attack_drills import attacks, report

        with tempfile.TemporaryDirectory() as tmp:
            print(report(attacks(Path(tmp))), flush=True)
        if a.attacks_only:
            return
    rng = random.Random(a.seed)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        recipe = write_command_recipe(root, workers=a.workers)
        whole = subprocess.run(probe_cmd(recipe, root / "whole"), capture_output=True, text=True, check=True)
        truth = summary(json.loads(whole.stdout))
        kills = orphans = resumes = differ = 0
        trial = 0
        while kills < a.kills:
            results = root / f"trial{trial}"
            trial += 1
            for _ in range(a.kills_per_resume):
                if kills >= a.kills:
                    break
                done = kill_mid_probe(probe_cmd(recipe, results), results, 0, rng.uniform(0.0, 3.0))
                left = wait_dead(trainer_pids(results), timeout_s=10)
                kills += 1
                orphans += len(left)
                print(f"kill {kills}: {done} runs finished at the kill, {len(left)} trainer(s) left alive")
            out = subprocess.run(probe_cmd(recipe, results), capture_output=True, text=True)
            resumes += 1
            same = out.returncode == 0 and summary(json.loads(out.stdout)) == truth
            differ += not same
            print(f"resume {resumes}: {'identical answer' if same else 'DIFFERENT: ' + out.stderr[-300:]}")
    print(
        f"{kills} kill -9s ({a.workers} worker(s)), {orphans} orphaned trainers, {resumes} resumes, "
        f"{differ} with a different answer, {time.time() - t0:.0f} s"
    )
    print(
        json.dumps(
            {
                "kills": kills,
                "workers": a.workers,
                "orphans": orphans,
                "resumes": resumes,
                "resumes_differing": differ,
                "wall_s": round(time.time() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
