"""Attack drills (issue 33): what someone with write access to a results directory or a pull
request's trainer config can try, each run as the user would meet it (a fresh process).

- a malicious checkpoint: a real pre-training checkpoint (tiny-pretrain) overwritten by a pickle
  whose ``__reduce__`` creates a marker, then resumed by the backend's own resume path;
- a YAML alias bomb (9**12 values once expanded), a recursive alias and a 2000-deep mapping given
  to ``batchtune check``, the CI gate;
- a symlink escape: ``runs/`` of a results directory pointing at someone else's folder, then
  ``batchtune probe nqm`` into it.

Each case reports its exit code, its seconds, its one error line, and whether anything ran or was
written outside. ``python benchmarks/drills.py --attacks-only`` runs these alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

PLANT = """
import os, sys, torch
from batchtune.backends.pretrain_lm import LMRun
from batchtune.recipe.load import load_recipe
recipe = load_recipe("recipes/tiny-pretrain.toml")
run = LMRun(recipe, seed=0)
run.step(4, 1e-3)
file = run.save_checkpoint(sys.argv[1])
LMRun.resume_from(file, recipe)  # the real checkpoint resumes
class Payload:
    def __reduce__(self):
        return (os.mkdir, (sys.argv[2],))
torch.save({"model": Payload(), "seed": 0}, file)  # the attacker's file in its place
"""
RESUME = """
import sys
from batchtune.backends.pretrain_lm import LMRun
from batchtune.backends.spec import RunFailed
from batchtune.recipe.load import load_recipe
try:
    LMRun.resume_from(sys.argv[1], load_recipe("recipes/tiny-pretrain.toml"))
except RunFailed as exc:
    print("error:", exc.message, file=sys.stderr)
    sys.exit(2)
"""


def _bomb() -> str:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 12):
        prev = "a" if i == 1 else f"n{i - 1}"
        lines.append(f"n{i}: &n{i} {{" + ", ".join(f"k{j}: *{prev}" for j in range(9)) + "}")
    return "\n".join(lines) + "\n"


def _run(args: list[str], timeout: float = 120) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    try:
        out = subprocess.run(args, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, time.perf_counter() - t0, f"still running after {timeout:.0f} s (a hang)"
    lines = out.stderr.strip().splitlines()
    return out.returncode, time.perf_counter() - t0, lines[-1] if lines else ""


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def attacks(root: Path) -> list[dict[str, object]]:
    """Run every case under ``root``; one dict per case."""
    bt = [sys.executable, "-m", "batchtune"]
    cases: list[dict[str, object]] = []
    marker, ckpt = root / "payload-ran", root / "ckpt" / "state.pt"
    subprocess.run([sys.executable, "-c", PLANT, str(ckpt), str(marker)], env=ENV, cwd=ROOT, check=True)
    rc, secs, err = _run([sys.executable, "-c", RESUME, str(ckpt)])
    cases.append({"case": "malicious checkpoint (pretrain resume)", "exit": rc, "s": secs, "error": err,
                  "breach": marker.exists()})  # fmt: skip
    configs = {"yaml alias bomb": _bomb(), "recursive yaml alias": "a: &a\n  b: *a\n",
               "2000-deep yaml mapping": "a: " + "{a: " * 2000 + "1" + "}" * 2000 + "\n"}  # fmt: skip
    for name, text in configs.items():
        cfg = root / f"{name.replace(' ', '-')}.yaml"
        cfg.write_text(text)
        rc, secs, err = _run([*bt, "check", str(cfg), "-r", str(root / "no-results")], timeout=60)
        cases.append({"case": f"{name} (check)", "exit": rc, "s": secs, "error": err,
                      "breach": (root / "no-results").exists()})  # fmt: skip
    victim, res = root / "victim", root / "res"
    victim.mkdir()
    (victim / "steps.jsonl").write_text("someone else's data\n")
    res.mkdir()
    (res / "runs").symlink_to(victim)
    before = _snapshot(victim)
    rc, secs, err = _run([*bt, "probe", "nqm", "-r", str(res)])
    cases.append({"case": "symlink escape: runs/ -> another folder (probe nqm)", "exit": rc, "s": secs,
                  "error": err, "breach": _snapshot(victim) != before})  # fmt: skip
    return cases


def report(cases: list[dict[str, object]]) -> str:
    lines = [
        f"{c['case']}: exit {c['exit']} in {float(c['s']):.1f} s, "  # type: ignore[arg-type]
        f"{'BREACH' if c['breach'] else 'nothing ran or was written outside'}; {c['error']}"
        for c in cases
    ]
    refused = sum(c["exit"] == 2 and not c["breach"] for c in cases)
    lines.append(f"{len(cases)} attack drills: {refused} refused with exit 2 and no breach, "
                 f"{sum(bool(c['breach']) for c in cases)} breaches")  # fmt: skip
    return "\n".join(lines)
