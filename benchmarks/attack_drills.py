"""Attack drills (issue 33): what someone with write access to a results directory or a pull
request's trainer config can try, each run as the user would meet it (a fresh process).

- a malicious checkpoint: the first trunk checkpoint of a finished branched pre-training probe
  (tiny-pretrain-branched, a few seconds) overwritten by a pickle whose ``__reduce__`` creates a
  marker, its branches removed, then ``batchtune probe`` resumed over it (the branches start from
  that file): a breach is the marker, or a branch sealed from it;
- a YAML alias bomb (9**12 values once expanded), a recursive alias and a 2000-deep mapping given
  to ``batchtune check``, the CI gate;
- a symlink escape: ``runs/`` of a results directory pointing at someone else's folder, then
  ``batchtune probe nqm`` into it;
- a tampered sealed run: a finished NQM probe's ``run.json`` given another run's ``run_id``, then
  the probe resumed (a breach: any file of the results directory changed).

Each case reports its exit code, its seconds (the attacked command's alone), its one error line,
and whether anything ran or was written outside. ``python benchmarks/drills.py --attacks-only``
runs these alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

PLANT = """
import os, sys, torch
class Payload:
    def __reduce__(self):
        return (os.mkdir, (sys.argv[2],))
torch.save({"model": Payload(), "seed": 0}, sys.argv[1])  # the attacker's file in its place
"""
# a branched pre-training probe of seconds: sequences of 8 tokens, 3 batches, a trunk of 512 tokens
PRETRAIN = ["pretrain.seq_len=8", "pretrain.batches_tokens=[8, 16, 32]", "lr_scaling.reference_batch=8",
            "pretrain.max_tokens=2048", "pretrain.eval_every_tokens=32", "pretrain.eval_sequences=16",
            "pretrain.warmup_tokens=0", "pretrain.targets=[3.0]", "branch.trunk_samples=512",
            "branch.checkpoints=[0.5, 1.0]", "branch.window_samples=128", "branch.min_steps=2",
            "budget.seeds=[0, 1]", "branch.confirm_seeds=2", "branch.max_seeds=2"]  # fmt: skip
NQM_SMALL = ["candidates.prompts=[1, 4, 16]", "budget.seeds=[0, 1]"]


def _sets(values: list[str]) -> list[str]:
    return [a for v in values for a in ("--set", v)]


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
    cases.append(_planted_checkpoint(root, bt))
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
    cases.append(_tampered_run(root, bt))
    return cases


def _planted_checkpoint(root: Path, bt: list[str]) -> dict[str, object]:
    res, marker = root / "pretrain", root / "payload-ran"
    probe = [*bt, "probe", "tiny-pretrain-branched", "-r", str(res), *_sets(PRETRAIN)]
    subprocess.run(probe, env=ENV, cwd=ROOT, check=True, capture_output=True)
    store = res / "branched"
    ckpt = store / "checkpoints" / "ckpt-256" / "state.pt"
    subprocess.run([sys.executable, "-c", PLANT, str(ckpt), str(marker)], env=ENV, cwd=ROOT, check=True)
    for run in (store / "runs").glob("c256-*"):  # the branches to start from it again
        shutil.rmtree(run)
    rc, secs, err = _run(probe)
    sealed = list((store / "runs").glob("c256-*/run.json"))
    return {"case": "malicious checkpoint (branched pre-training probe resumed over it)", "exit": rc,
            "s": secs, "error": err, "breach": marker.exists() or bool(sealed)}  # fmt: skip


def _tampered_run(root: Path, bt: list[str]) -> dict[str, object]:
    res = root / "tampered"
    probe = [*bt, "probe", "nqm", "-r", str(res), *_sets(NQM_SMALL)]
    subprocess.run(probe, env=ENV, cwd=ROOT, check=True, capture_output=True)
    path = res / "runs" / "P4xG8-s1" / "run.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "run_id": "P4xG8-s0"}))
    before = _snapshot(res)
    rc, secs, err = _run(probe)
    return {"case": "tampered sealed run: run.json of another run_id (probe nqm resumed)", "exit": rc,
            "s": secs, "error": err, "breach": _snapshot(res) != before}  # fmt: skip


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
